package main_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/internal/version"
)

// documents splits a YAML file into its documents and decodes each,
// strictly (unknown fields fail), into the typed object of its kind.
func documents(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]any{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		var meta struct{ Kind string }
		require.NoError(t, yaml.Unmarshal([]byte(doc), &meta))
		if meta.Kind == "" {
			continue
		}
		var obj any
		switch meta.Kind {
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "Pod":
			obj = &corev1.Pod{}
		default:
			t.Fatalf("%s: unexpected kind %s", path, meta.Kind)
		}
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), obj), "%s: %s", path, meta.Kind)
		require.NotContains(t, out, meta.Kind)
		out[meta.Kind] = obj
	}
	return out
}

// checkPodSpec checks what both pod manifests must have and that the
// container's arguments and environment pass the binary's validation.
func checkPodSpec(t *testing.T, spec corev1.PodSpec) corev1.Container {
	t.Helper()
	assert.True(t, spec.HostNetwork)
	assert.Equal(t, "system-node-critical", spec.PriorityClassName)
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]
	// The image is pinned to this tree's release, the tag make image
	// builds; never a moving tag.
	assert.Equal(t, "ghcr.io/apifailover/localproxy:"+version.Release, c.Image)
	assert.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy)
	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.NotNil(t, sc.RunAsUser)
	assert.Equal(t, int64(65534), *sc.RunAsUser)
	require.NotNil(t, sc.ReadOnlyRootFilesystem)
	assert.True(t, *sc.ReadOnlyRootFilesystem)
	require.NotNil(t, sc.AllowPrivilegeEscalation)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	require.NotNil(t, sc.Capabilities)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.Empty(t, sc.Capabilities.Add)
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		require.NotNil(t, probe)
		require.NotNil(t, probe.HTTPGet)
		assert.Equal(t, path, probe.HTTPGet.Path)
		assert.Equal(t, intstr.FromInt32(7446), probe.HTTPGet.Port)
		// hostNetwork: the kubelet would probe the node IP, the health
		// server listens on loopback.
		assert.Equal(t, "127.0.0.1", probe.HTTPGet.Host)
	}
	return c
}

func TestDaemonSetManifest(t *testing.T) {
	docs := documents(t, filepath.Join("deploy", "daemonset.yaml"))
	sa := docs["ServiceAccount"].(*corev1.ServiceAccount)
	role := docs["ClusterRole"].(*rbacv1.ClusterRole)
	binding := docs["ClusterRoleBinding"].(*rbacv1.ClusterRoleBinding)
	ds := docs["DaemonSet"].(*appsv1.DaemonSet)

	assert.Equal(t, "kube-system", sa.Namespace)
	var slices, endpoints, nodes bool
	for _, r := range role.Rules {
		if r.APIGroups[0] == "discovery.k8s.io" && r.Resources[0] == "endpointslices" {
			slices = assert.ElementsMatch(t, []string{"list", "watch"}, r.Verbs)
		}
		if r.APIGroups[0] == "" && r.Resources[0] == "endpoints" {
			endpoints = assert.Equal(t, []string{"get"}, r.Verbs)
		}
		if r.APIGroups[0] == "" && r.Resources[0] == "nodes" {
			nodes = assert.Equal(t, []string{"get"}, r.Verbs, "the zone label is read, not watched")
		}
	}
	assert.True(t, slices, "endpointslices list/watch")
	assert.True(t, endpoints, "endpoints get")
	assert.True(t, nodes, "nodes get")
	assert.Equal(t, role.Name, binding.RoleRef.Name)
	require.Len(t, binding.Subjects, 1)
	assert.Equal(t, sa.Name, binding.Subjects[0].Name)
	assert.Equal(t, sa.Namespace, binding.Subjects[0].Namespace)

	spec := ds.Spec.Template.Spec
	assert.Equal(t, sa.Name, spec.ServiceAccountName)
	assert.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	assert.Equal(t, corev1.DNSDefault, spec.DNSPolicy, "the node's resolver: cluster DNS needs the API path this proxy is")
	c := checkPodSpec(t, spec)
	sc := c.SecurityContext
	assert.Contains(t, c.Args, "--enable-discovery=true")

	// An upgrade starts the new pod beside the old one and stops the old
	// one only once the new one is ready: the node never lacks a
	// listener on 127.0.0.1:7445 (SO_REUSEPORT lets both bind).
	us := ds.Spec.UpdateStrategy
	assert.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, us.Type)
	require.NotNil(t, us.RollingUpdate)
	require.NotNil(t, us.RollingUpdate.MaxSurge, "maxSurge")
	require.NotNil(t, us.RollingUpdate.MaxUnavailable, "maxUnavailable")
	assert.Equal(t, intstr.FromInt32(1), *us.RollingUpdate.MaxSurge)
	assert.Equal(t, intstr.FromInt32(0), *us.RollingUpdate.MaxUnavailable)
	// With hostNetwork every containerPort is a hostPort, which the
	// scheduler lets only one pod per node hold: the surge pod would
	// never be scheduled.
	assert.True(t, spec.HostNetwork)
	for _, ctr := range spec.Containers {
		assert.Empty(t, ctr.Ports, "container %s declares ports: they become host ports and block the surge pod", ctr.Name)
	}

	// The arguments validate, given a service account.
	dir := t.TempDir()
	token, ca := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(token, []byte("t"), 0o600))
	f := newFiles(t)
	caPEM, err := os.ReadFile(f.ca)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(ca, caPEM, 0o600))
	defer main.SetServiceAccount(token, ca)()
	envs := map[string]string{}
	for _, e := range c.Env {
		envs[e.Name] = e.Value
		if e.Name == "NODE_NAME" {
			// The node's name, from the downward API.
			require.NotNil(t, e.ValueFrom)
			require.NotNil(t, e.ValueFrom.FieldRef)
			assert.Equal(t, "spec.nodeName", e.ValueFrom.FieldRef.FieldPath)
			envs[e.Name] = "node-1"
		}
	}
	assert.Contains(t, envs, "NODE_NAME")
	assert.NotContains(t, envs, "LOCALPROXY_ZONE", "no zone by default: the node's label")
	cfg, err := main.ParseConfig(mountedStateFile(t, c.Args), func(k string) string { return envs[k] })
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:7445", cfg.Discovery.Host)
	assert.Equal(t, "node-1", cfg.NodeName)
	assert.Same(t, cfg.Discovery, cfg.NodeClient)

	// The state file is on the node, in a directory the init container
	// gives to the proxy's user; one value drives the flag, the init
	// container and the mount.
	stateFile := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--state-file="); ok {
			stateFile = v
		}
	}
	assert.Equal(t, "/var/lib/localproxy/state.json", stateFile)
	stateDir := filepath.Dir(stateFile)
	require.Len(t, spec.Volumes, 1)
	vol := spec.Volumes[0]
	require.NotNil(t, vol.HostPath, "the state file outlives the pod")
	assert.Equal(t, stateDir, vol.HostPath.Path)
	require.NotNil(t, vol.HostPath.Type)
	assert.Equal(t, corev1.HostPathDirectoryOrCreate, *vol.HostPath.Type)
	assert.Equal(t, []corev1.VolumeMount{{Name: vol.Name, MountPath: stateDir}}, c.VolumeMounts)
	require.Len(t, spec.InitContainers, 1)
	ic := spec.InitContainers[0]
	assert.Equal(t, c.Image, ic.Image)
	assert.Equal(t, []string{"state-dir", "--state-file=" + stateFile, "--owner=65534:65534"}, ic.Args)
	assert.Equal(t, c.VolumeMounts, ic.VolumeMounts)
	// Root for the chown, and nothing more.
	isc := ic.SecurityContext
	require.NotNil(t, isc)
	require.NotNil(t, isc.RunAsUser)
	assert.Equal(t, int64(0), *isc.RunAsUser)
	require.NotNil(t, isc.RunAsNonRoot)
	assert.False(t, *isc.RunAsNonRoot)
	require.NotNil(t, isc.AllowPrivilegeEscalation)
	assert.False(t, *isc.AllowPrivilegeEscalation)
	require.NotNil(t, isc.ReadOnlyRootFilesystem)
	assert.True(t, *isc.ReadOnlyRootFilesystem)
	require.NotNil(t, isc.Capabilities)
	assert.Equal(t, []corev1.Capability{"ALL"}, isc.Capabilities.Drop)
	assert.Equal(t, []corev1.Capability{"CHOWN"}, isc.Capabilities.Add)
	// The owner is the proxy's user.
	assert.Equal(t, fmt.Sprintf("--owner=%d:%d", *sc.RunAsUser, *spec.SecurityContext.RunAsGroup), ic.Args[2])
}

func TestStaticPodManifest(t *testing.T) {
	docs := documents(t, filepath.Join("deploy", "static-pod.yaml"))
	pod := docs["Pod"].(*corev1.Pod)
	assert.Equal(t, "kube-system", pod.Namespace)
	c := checkPodSpec(t, pod.Spec)
	// The arguments validate, with the CA file where the pod mounts it.
	f := newFiles(t)
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = strings.Replace(a, "--ca-file=/etc/kubernetes/pki/ca.crt", "--ca-file="+f.ca, 1)
	}
	_, err := main.ParseConfig(mountedStateFile(t, args), env())
	require.NoError(t, err)
}

// mountedStateFile returns args with --state-file moved into a temporary
// directory, standing in for the directory the pod mounts there: the
// state file's directory must exist at start.
func mountedStateFile(t *testing.T, args []string) []string {
	out := make([]string, len(args))
	dir := t.TempDir()
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--state-file="); ok {
			a = "--state-file=" + filepath.Join(dir, filepath.Base(v))
		}
		out[i] = a
	}
	return out
}

func TestSystemdUnitAndContainerfile(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join("deploy", "localproxy.service"))
	require.NoError(t, err)
	for _, want := range []string{"[Unit]", "[Service]", "[Install]", "ExecStart=/usr/local/bin/localproxy", "Before=kubelet.service", "DynamicUser=yes", "StateDirectory=apifailover", "Restart=always",
		"Type=notify\n", "NotifyAccess=main\n", "WatchdogSec=30s\n"} {
		assert.Contains(t, string(unit), want)
	}
	// The address families the sandbox leaves: IP, the socket
	// activation's and journald's Unix sockets, and netlink, through
	// which Go reads the host's addresses (net.InterfaceAddrs): without
	// it no API server on the node counted as local, silently.
	families := ""
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "RestrictAddressFamilies="); ok {
			families = v
		}
	}
	assert.ElementsMatch(t, []string{"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}, strings.Fields(families))
	sock, err := os.ReadFile(filepath.Join("deploy", "localproxy.socket"))
	require.NoError(t, err)
	// The socket unit listens where the service does by default, so
	// LISTEN_FDS matches its one listen address.
	for _, want := range []string{"[Socket]", "ListenStream=127.0.0.1:7445\n", "[Install]", "WantedBy=sockets.target", "Before=kubelet.service"} {
		assert.Contains(t, string(sock), want)
	}
	assert.Equal(t, 1, strings.Count(string(sock), "\nListenStream="), "one listen address")
	cf, err := os.ReadFile(filepath.Join("deploy", "Containerfile"))
	require.NoError(t, err)
	for _, want := range []string{"CGO_ENABLED=0", "FROM scratch", "USER 65534:65534", "./cmd/localproxy", `ENTRYPOINT ["/localproxy"]`} {
		assert.Contains(t, string(cf), want)
	}
}

// The Containerfile's build command makes a static binary (it must run on
// scratch), and systemd accepts the unit, every directive known, with
// ExecStart pointing at that binary. No container engine runs here, so the
// image itself is not built; its build step is.
func TestContainerfileBuildAndSystemdUnitVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cf, err := os.ReadFile(filepath.Join("deploy", "Containerfile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .*) -o /out/localproxy (\./cmd/localproxy)$`).FindStringSubmatch(string(cf))
	require.NotNil(t, m, "the Containerfile's build step changed; update this test")
	bin := filepath.Join(t.TempDir(), "localproxy")
	// The step as the Containerfile runs it, in a shell, with its build arg.
	build := exec.Command("sh", "-c", m[1]+" -o "+bin+" "+m[2])
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "VERSION=containerfile-test", "REVISION=0123abcd")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	f, err := elf.Open(bin)
	require.NoError(t, err)
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "the binary needs a dynamic loader; scratch has none")
		assert.NotEqual(t, elf.PT_DYNAMIC, p.Type, "the binary is dynamically linked")
	}
	f.Close()
	out, err = exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `^localproxy containerfile-test \(revision 0123abcd, go1\.\d+`, string(out))

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed: the unit is not verified")
	}
	unit, err := os.ReadFile(filepath.Join("deploy", "localproxy.service"))
	require.NoError(t, err)
	units := t.TempDir()
	path := filepath.Join(units, "apifailover-localproxy.service")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/localproxy", bin)), 0o644))
	sock, err := os.ReadFile(filepath.Join("deploy", "localproxy.socket"))
	require.NoError(t, err)
	sockPath := filepath.Join(units, "apifailover-localproxy.socket")
	require.NoError(t, os.WriteFile(sockPath, sock, 0o644))
	out, err = exec.Command(analyze, "verify", path, sockPath).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify warns")
}
