package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/hack/testbed"
)

// TestLocalProxy runs real clients and the real deployment files against
// localproxy on one test bed: kubectl through the in-process proxy under
// faults, the manifests through the apiserver's dry run, the
// cmd/localproxy binary started by hand (also learning its zone from its
// Node), and a user's kubeconfig rewritten by "localproxy kubeconfig", and
// a real HAProxy's backends kept
// equal to the healthy apiservers by the export.
func TestLocalProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bed := startBed(t, ctx)
	t.Run("kubectl-under-faults", func(t *testing.T) { testKubectlUnderFaults(t, ctx, bed) })
	t.Run("deploy-dry-run", func(t *testing.T) { testDeployDryRun(t, ctx, bed) })
	t.Run("zone", func(t *testing.T) { testZone(t, ctx, bed) })
	t.Run("binary", func(t *testing.T) { testBinary(t, ctx, bed) })
	t.Run("kubeconfig", func(t *testing.T) { testKubeconfigSubcommand(t, ctx, bed) })
	t.Run("export", func(t *testing.T) { testExport(t, ctx, bed) })
	t.Run("failback", func(t *testing.T) { testFailback(t, ctx, bed) })
	t.Run("handover-reuseport", func(t *testing.T) { testHandoverReusePort(t, ctx, bed) })
	t.Run("handover-socket-activation", func(t *testing.T) { testHandoverSocketActivation(t, ctx, bed) })
	t.Run("handover-static-pod-in-place", func(t *testing.T) { testStaticPodInPlace(t, ctx, bed) })
	t.Run("systemd", func(t *testing.T) { testSystemd(t, ctx, bed) })
}

// kubectlAt runs the bed's kubectl with kubeconfig, bounded by 20 s.
func kubectlAt(ctx context.Context, bed *testbed.Bed, kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bed.KubectlPath(), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// kubectlRounds runs get --raw /readyz, get namespaces and create
// configmap through kubeconfig for at least d, each round right after the
// previous one; every command must succeed. It returns the rounds run.
func kubectlRounds(t *testing.T, ctx context.Context, bed *testbed.Bed, kubeconfig, ns, what string, d time.Duration) int {
	t.Helper()
	end := time.Now().Add(d)
	n := 0
	for first := true; first || time.Now().Before(end); first = false {
		n++
		began := time.Now()
		for _, args := range [][]string{
			{"get", "--raw", "/readyz"},
			{"get", "namespaces", "-o", "name"},
			{"create", "configmap", "-n", ns, fmt.Sprintf("%s-%d", what, n), "--from-literal=round=" + fmt.Sprint(n)},
		} {
			start := time.Now()
			out, err := kubectlAt(ctx, bed, kubeconfig, args...)
			if err != nil {
				t.Errorf("%s, round %d (+%.3fs): %v", what, n, start.Sub(began).Seconds(), err)
				continue
			}
			if args[1] == "--raw" && strings.TrimSpace(out) != "ok" {
				t.Errorf("%s, round %d: /readyz said %q", what, n, out)
			}
		}
	}
	return n
}

// testKubectlUnderFaults: kubectl through 127.0.0.1:7445 keeps working
// while the preferred apiserver is killed and then the next one is
// blackholed.
func testKubectlUnderFaults(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	logs := &logBuffer{}
	p := startLocalProxy(t, ctx, bed, prometheus.NewRegistry(), logs.logger(), connectOptions{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "localproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	waitProxyHealthy(t, ctx, bed, p)
	e := &env{t: t, ctx: ctx, bed: bed}
	const ns = "kubectl-localproxy"
	if _, err := kubectlAt(ctx, bed, kubeconfig, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	kubectlRounds(t, ctx, bed, kubeconfig, ns, "before", 0)

	preferred := func() *testbed.APIServer {
		for _, s := range p.Pool().Status() {
			if s.Preferred {
				for _, a := range bed.APIServers() {
					if a.Addr() == s.Addr {
						return a
					}
				}
			}
		}
		t.Fatalf("no preferred apiserver: %+v", p.Pool().Status())
		return nil
	}
	killed := preferred()
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	n := kubectlRounds(t, ctx, bed, kubeconfig, ns, "kill", 3*time.Second)
	t.Logf("killed %s: %d rounds of kubectl, all through the proxy", killed.Addr(), n)

	// Wait until the proxy prefers another apiserver, then blackhole it.
	if err := e.waitFor("proxy marks "+killed.Addr()+" down", observeLimit, func() bool { return preferred() != killed }); err != nil {
		t.Fatal(err)
	}
	holed := preferred()
	if err := holed.Blackhole(); err != nil {
		t.Fatal(err)
	}
	n = kubectlRounds(t, ctx, bed, kubeconfig, ns, "blackhole", 4*time.Second)
	t.Logf("blackholed %s: %d rounds of kubectl, all through the proxy", holed.Addr(), n)

	out, err := kubectlAt(ctx, bed, kubeconfig, "get", "configmaps", "-n", ns, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d configmaps created through the proxy", strings.Count(out, "configmap/")-1) // minus kube-root-ca.crt, if the controller ran
}

// testDeployDryRun validates the deployment manifests with the apiserver
// (admission, defaulting, schema) without creating anything.
func testDeployDryRun(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The bed runs no controller-manager, so kube-system lacks the
	// "default" ServiceAccount every cluster has; the ServiceAccount
	// admission plugin wants it for the static pod's (dry-run) create.
	if _, err := bed.Kubectl(ctx, "get", "serviceaccount", "-n", "kube-system", "default"); err != nil {
		if _, err := bed.Kubectl(ctx, "create", "serviceaccount", "-n", "kube-system", "default"); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"daemonset.yaml", "static-pod.yaml"} {
		t.Run(f, func(t *testing.T) {
			path := filepath.Join(root, "cmd", "localproxy", "deploy", f)
			out, err := bed.Kubectl(ctx, "apply", "--dry-run=server", "--validate=strict", "-f", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", strings.TrimSpace(out))
			if !strings.Contains(out, "(server dry run)") {
				t.Errorf("kubectl apply --dry-run=server printed %q", out)
			}
		})
	}
}

// testBinary builds cmd/localproxy, starts it with flags against the bed
// (readyz probes, discovery as the localproxy identity, a state file) and
// checks that kubectl works through it, also with an apiserver killed,
// that `localproxy status` lists every apiserver and that SIGTERM stops it
// cleanly.
func testBinary(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)

	discoveryKubeconfig := filepath.Join(dir, "discovery.kubeconfig")
	if err := bed.WriteKubeconfig(discoveryKubeconfig, testbed.Origin, testbed.LocalProxyIdentity); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "localproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, s := range bed.APIServers() {
		eps = append(eps, s.Addr())
	}
	logFile, err := os.Create(filepath.Join(dir, "localproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin,
		"--endpoints="+strings.Join(eps, ","),
		"--ca-file="+bed.CAFile(),
		"--tls-server-name="+bed.OriginName(),
		"--enable-discovery",
		"--kubeconfig="+discoveryKubeconfig,
		"--state-file="+filepath.Join(dir, "state.json"),
		"--shutdown-timeout=2s",
		"--log-level=2",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("localproxy did not exit within 15s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("localproxy: %v", err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("localproxy log:\n%s", b)
		}
	})

	e := &env{t: t, ctx: ctx, bed: bed}
	ready := func() bool {
		resp, err := http.Get("http://" + proxyHealthAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if err := e.waitFor("localproxy /readyz", observeLimit, ready); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		out, err := exec.CommandContext(ctx, bin, "status").CombinedOutput()
		if err != nil {
			t.Fatalf("localproxy status: %v\n%s", err, out)
		}
		return string(out)
	}
	// Every apiserver healthy in the table (the readiness above needs one).
	var table string
	err = e.waitFor("every apiserver healthy in localproxy status", observeLimit, func() bool {
		table = status()
		for _, a := range eps {
			if !lineHas(table, a, "healthy") {
				return false
			}
		}
		return true
	})
	t.Logf("localproxy status:\n%s", table)
	if err != nil {
		t.Fatal(err)
	}
	// Every apiserver healthy: the held prober's rounds come every 5s
	// (its quiet interval), and /healthz must stay ok between them,
	// through more than one round (the node's liveness probe would
	// restart a proxy that fails it).
	for end := time.Now().Add(7 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + proxyHealthAddr + "/healthz")
		if err != nil {
			t.Fatalf("localproxy /healthz while every apiserver is healthy: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("localproxy /healthz while every apiserver is healthy: %d %s", resp.StatusCode, bytes.TrimSpace(body))
		}
	}

	const ns = "kubectl-localproxy-binary"
	if _, err := kubectlAt(ctx, bed, kubeconfig, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	kubectlRounds(t, ctx, bed, kubeconfig, ns, "binary", 0)
	victim := bed.APIServers()[0]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	kubectlRounds(t, ctx, bed, kubeconfig, ns, "binary-kill", 2*time.Second)
	if err := e.waitFor("localproxy status shows "+victim.Addr()+" down", observeLimit, func() bool {
		table = status()
		return strings.Contains(table, victim.Addr()) && !lineHas(table, victim.Addr(), "healthy")
	}); err != nil {
		t.Errorf("%v:\n%s", err, table)
	}
	t.Logf("localproxy status with %s killed:\n%s", victim.Addr(), table)
	if err := stop(); err != nil {
		t.Errorf("localproxy after SIGTERM: %v", err)
	}
}

// buildLocalProxy builds cmd/localproxy into dir and returns the binary.
func buildLocalProxy(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	bin, err := testbed.GoBuild(ctx, dir, "./cmd/localproxy", false)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// lineHas reports whether a line of table holds every one of words as a
// whole field.
func lineHas(table string, words ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		fields := strings.Fields(line)
		all := true
		for _, w := range words {
			found := false
			for _, f := range fields {
				if f == w {
					found = true
				}
			}
			all = all && found
		}
		if all {
			return true
		}
	}
	return false
}

// healBed restores every apiserver of bed now and again when the test
// ends, so that a subtest starts from, and leaves, a whole control plane.
func healBed(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	t.Helper()
	if err := bed.Heal(ctx); err != nil {
		t.Fatalf("heal: %v", err)
	}
	t.Cleanup(func() {
		if err := bed.Heal(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("heal: %v", err)
		}
	})
}
