package main_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	main "github.com/apifailover/apifailover/cmd/localproxy"
)

// kubeconfigYAML is a kubeconfig with clusters (name: body) used by
// contexts of the same names, current-context current, user "u" with a
// token file, and extra appended as is.
func kubeconfigYAML(current string, clusters map[string]string, extra string) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\nclusters:\n")
	for name, body := range clusters {
		b.WriteString("- name: " + name + "\n  cluster: " + body + "\n")
	}
	b.WriteString("contexts:\n")
	for name := range clusters {
		b.WriteString("- name: " + name + "\n  context: {cluster: " + name + ", user: u}\n")
	}
	b.WriteString("users:\n- name: u\n  user: {tokenFile: /var/run/token}\n")
	if current != "" {
		b.WriteString("current-context: " + current + "\n")
	}
	b.WriteString(extra)
	return b.String()
}

// writeKubeconfig writes content to dir/name with mode 0600.
func writeKubeconfig(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func runKubeconfig(t *testing.T, getenv func(string) string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = main.Run(t.Context(), append([]string{"kubeconfig"}, args...), getenv, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestKubeconfigRewrites(t *testing.T) {
	type cluster struct{ server, serverName string }
	tests := []struct {
		name     string
		clusters map[string]string
		current  string
		args     []string
		env      []string
		// want are the clusters after, by name.
		want map[string]cluster
		// stderr lists what the message must say.
		stderr []string
	}{
		{
			name:     "hostname server",
			clusters: map[string]string{"k": "{server: 'https://api.example.com:6443', certificate-authority-data: Zm9v}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "api.example.com"}},
			stderr:   []string{`cluster "k" (context "k"): server https://api.example.com:6443 -> https://127.0.0.1:7445, tls-server-name api.example.com (the old server's host)`},
		},
		{
			name:     "IP server",
			clusters: map[string]string{"k": "{server: 'https://10.0.0.11:6443'}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "10.0.0.11"}},
			stderr:   []string{"tls-server-name 10.0.0.11 (the old server's host)", "note: tls-server-name 10.0.0.11 is an IP address: every API server's certificate must carry it"},
		},
		{
			name:     "IPv6 server without port",
			clusters: map[string]string{"k": "{server: 'https://[fd00::1]'}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "fd00::1"}},
		},
		{
			name:     "existing tls-server-name kept",
			clusters: map[string]string{"k": "{server: 'https://10.0.0.11:6443', tls-server-name: kubernetes.default.svc}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "kubernetes.default.svc"}},
			stderr:   []string{"tls-server-name kubernetes.default.svc (kept)"},
		},
		{
			name:     "tls-server-name flag wins",
			clusters: map[string]string{"k": "{server: 'https://10.0.0.11:6443', tls-server-name: old.example.com}"},
			current:  "k",
			args:     []string{"--tls-server-name=kubernetes.default.svc"},
			env:      []string{"LOCALPROXY_TLS_SERVER_NAME", "env.example.com"},
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "kubernetes.default.svc"}},
			stderr:   []string{"tls-server-name kubernetes.default.svc (was old.example.com; --tls-server-name)"},
		},
		{
			name:     "proxy's environment",
			clusters: map[string]string{"k": "{server: 'https://api.example.com'}"},
			current:  "k",
			env: []string{"LOCALPROXY_TLS_SERVER_NAME", "kubernetes.default.svc", "LOCALPROXY_BIND_PORT", "7500",
				"LOCALPROXY_BIND_ADDRESS", "10.1.2.3,::1", "LOCALPROXY_HEALTH_PORT", "nonsense"},
			want:   map[string]cluster{"k": {"https://[::1]:7500", "kubernetes.default.svc"}},
			stderr: []string{"(LOCALPROXY_TLS_SERVER_NAME)"},
		},
		{
			name:     "bind flags, unspecified address",
			clusters: map[string]string{"k": "{server: 'https://api.example.com'}"},
			current:  "k",
			args:     []string{"--bind-address=0.0.0.0", "--bind-port=8443"},
			want:     map[string]cluster{"k": {"https://127.0.0.1:8443", "api.example.com"}},
		},
		{
			name:     "IPv4-mapped unspecified bind address, as localproxy takes it",
			clusters: map[string]string{"k": "{server: 'https://api.example.com'}"},
			current:  "k",
			args:     []string{"--bind-address=::ffff:0.0.0.0"},
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "api.example.com"}},
		},
		{
			name: "context flag",
			clusters: map[string]string{
				"a": "{server: 'https://a.example.com:6443'}",
				"b": "{server: 'https://b.example.com:6443'}",
			},
			current: "a",
			args:    []string{"--context=b"},
			want: map[string]cluster{
				"a": {"https://a.example.com:6443", ""},
				"b": {"https://127.0.0.1:7445", "b.example.com"},
			},
			stderr: []string{`cluster "b" (context "b")`},
		},
		{
			name:     "already localproxy, new name",
			clusters: map[string]string{"k": "{server: 'https://127.0.0.1:7445', tls-server-name: old.example.com}"},
			current:  "k",
			args:     []string{"--tls-server-name=new.example.com"},
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445", "new.example.com"}},
			stderr:   []string{"server https://127.0.0.1:7445 (already localproxy), tls-server-name new.example.com (was old.example.com; --tls-server-name)"},
		},
		{
			name:     "already localproxy",
			clusters: map[string]string{"k": "{server: 'https://127.0.0.1:7445/', tls-server-name: api.example.com}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://127.0.0.1:7445/", "api.example.com"}},
			stderr:   []string{`cluster "k" (context "k") already points at https://127.0.0.1:7445/ with tls-server-name api.example.com: nothing to change`},
		},
		{
			name:     "already localproxy, IPv4-mapped",
			clusters: map[string]string{"k": "{server: 'https://[::ffff:127.0.0.1]:7445', tls-server-name: api.example.com}"},
			current:  "k",
			want:     map[string]cluster{"k": {"https://[::ffff:127.0.0.1]:7445", "api.example.com"}},
			stderr:   []string{`already points at https://[::ffff:127.0.0.1]:7445 with tls-server-name api.example.com: nothing to change`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeKubeconfig(t, t.TempDir(), "config", kubeconfigYAML(tc.current, tc.clusters, ""))
			code, stdout, stderr := runKubeconfig(t, env(tc.env...), append([]string{"--kubeconfig=" + path}, tc.args...)...)
			require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
			for _, w := range tc.stderr {
				assert.Contains(t, stderr, w)
			}
			cfg, err := clientcmd.Load([]byte(stdout))
			require.NoError(t, err, "stdout: %s", stdout)
			assert.Equal(t, tc.current, cfg.CurrentContext, "current-context unchanged")
			require.Len(t, cfg.Clusters, len(tc.want))
			for name, w := range tc.want {
				assert.Equal(t, w.server, cfg.Clusters[name].Server, "cluster %s", name)
				assert.Equal(t, w.serverName, cfg.Clusters[name].TLSServerName, "cluster %s", name)
			}
			assert.Equal(t, "/var/run/token", cfg.AuthInfos["u"].TokenFile, "credentials unchanged")
		})
	}
}

// A kubeadm-like kubelet kubeconfig keeps everything but the server and
// the name, and its relative paths point at the same files from anywhere.
func TestKubeconfigKeepsTheRest(t *testing.T) {
	dir := t.TempDir()
	path := writeKubeconfig(t, dir, "etc/kubelet.conf", `apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    server: https://cp.example.com:6443
    certificate-authority: pki/ca.crt
    extensions:
    - name: example.com/x
      extension: {foo: bar}
contexts:
- name: system:node:n1@kubernetes
  context: {cluster: kubernetes, user: system:node:n1, namespace: ns1}
- name: exec@kubernetes
  context: {cluster: kubernetes, user: exec}
current-context: system:node:n1@kubernetes
preferences: {colors: true}
users:
- name: system:node:n1
  user:
    client-certificate: ../var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
    tokenFile: token
- name: exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
      args: [eks, get-token]
      interactiveMode: Never
- name: local-exec
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: bin/helper, interactiveMode: Never}
`)
	before, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)

	code, stdout, stderr := runKubeconfig(t, env(), "--kubeconfig="+path)
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	assert.Contains(t, stderr, `cluster "kubernetes" (context "system:node:n1@kubernetes"; also used by context "exec@kubernetes")`)
	after, err := clientcmd.Load([]byte(stdout))
	require.NoError(t, err)

	etc := filepath.Join(dir, "etc")
	c := after.Clusters["kubernetes"]
	assert.Equal(t, "https://127.0.0.1:7445", c.Server)
	assert.Equal(t, "cp.example.com", c.TLSServerName)
	assert.Equal(t, filepath.Join(etc, "pki/ca.crt"), c.CertificateAuthority)
	u := after.AuthInfos["system:node:n1"]
	assert.Equal(t, filepath.Join(dir, "var/lib/kubelet/pki/kubelet-client-current.pem"), u.ClientCertificate)
	assert.Equal(t, "/var/lib/kubelet/pki/kubelet-client-current.pem", u.ClientKey, "absolute paths stay")
	assert.Equal(t, filepath.Join(etc, "token"), u.TokenFile)
	assert.Equal(t, "aws", after.AuthInfos["exec"].Exec.Command, "a command looked up in $PATH stays")
	// client-go runs a command with a directory in it relative to the
	// kubeconfig (clientcmd.ResolveLocalPaths), so it moves with the rest.
	assert.Equal(t, filepath.Join(etc, "bin/helper"), after.AuthInfos["local-exec"].Exec.Command)

	// The rest is as before, once client-go has resolved the paths of both.
	require.NoError(t, clientcmd.ResolveLocalPaths(before))
	before.Clusters["kubernetes"].Server, before.Clusters["kubernetes"].TLSServerName = c.Server, c.TLSServerName
	clearOrigins(before)
	assert.Equal(t, before, after)
}

func clearOrigins(cfg *clientcmdapi.Config) {
	for _, c := range cfg.Clusters {
		c.LocationOfOrigin = ""
	}
	for _, a := range cfg.AuthInfos {
		a.LocationOfOrigin = ""
	}
	for _, c := range cfg.Contexts {
		c.LocationOfOrigin = ""
	}
}

func TestKubeconfigInPlace(t *testing.T) {
	dir := t.TempDir()
	content := kubeconfigYAML("k", map[string]string{"k": "{server: 'https://api.example.com:6443', certificate-authority: pki/ca.crt}"}, "# a comment\n")
	path := writeKubeconfig(t, dir, "kubelet.conf", content)
	require.NoError(t, os.Chmod(path, 0o640))
	link := filepath.Join(dir, "link.conf")
	require.NoError(t, os.Symlink("kubelet.conf", link))

	code, stdout, stderr := runKubeconfig(t, env(), "--kubeconfig="+link, "--in-place")
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	assert.Empty(t, stdout)
	backups, err := filepath.Glob(filepath.Join(dir, "kubelet.conf.*.bak"))
	require.NoError(t, err)
	require.Len(t, backups, 1, "one backup, beside the file the link points to")
	assert.Contains(t, stderr, "rewrote "+link+"; the old one is in "+backups[0])
	assert.Regexp(t, `kubelet\.conf\.\d{8}T\d{6}Z\.bak$`, backups[0])

	old, err := os.ReadFile(backups[0])
	require.NoError(t, err)
	assert.Equal(t, content, string(old), "the backup is the old file, byte for byte")
	for _, p := range []string{path, backups[0]} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o640), fi.Mode().Perm(), "mode of %s", p)
	}
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, fi.Mode().Type(), "the link stays a link")
	cfg, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:7445", cfg.Clusters["k"].Server)
	assert.Equal(t, "api.example.com", cfg.Clusters["k"].TLSServerName)
	assert.Equal(t, "pki/ca.crt", cfg.Clusters["k"].CertificateAuthority, "in place, relative paths still hold")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 3, "no temporary file left: %v", entries)

	// Again: nothing to do, nothing written, no second backup.
	rewritten, err := os.ReadFile(path)
	require.NoError(t, err)
	code, _, stderr = runKubeconfig(t, env(), "--kubeconfig="+path, "--in-place")
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	assert.Contains(t, stderr, "already points at https://127.0.0.1:7445 with tls-server-name api.example.com: nothing to change")
	assert.Contains(t, stderr, path+" left as it is")
	again, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, rewritten, again)
	backups, err = filepath.Glob(filepath.Join(dir, "kubelet.conf.*.bak"))
	require.NoError(t, err)
	assert.Len(t, backups, 1)
}

// Root rewriting another user's kubeconfig leaves it, and the backup,
// that user's.
func TestKubeconfigInPlaceKeepsOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the file another owner")
	}
	dir := t.TempDir()
	path := writeKubeconfig(t, dir, "config", kubeconfigYAML("k", map[string]string{"k": "{server: 'https://api.example.com'}"}, ""))
	require.NoError(t, os.Chown(path, 4321, 4322))
	code, _, stderr := runKubeconfig(t, env(), "--kubeconfig="+path, "--in-place")
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	backups, err := filepath.Glob(path + ".*.bak")
	require.NoError(t, err)
	require.Len(t, backups, 1)
	for _, p := range []string{path, backups[0]} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, [2]uint32{4321, 4322}, [2]uint32{st.Uid, st.Gid}, "owner of %s", p)
	}
}

// An existing backup is never overwritten: the file stays as it is.
func TestKubeconfigBackupExists(t *testing.T) {
	dir := t.TempDir()
	path := writeKubeconfig(t, dir, "config", "old")
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.FixedZone("CET", 3600))
	backup := filepath.Join(dir, "config.20260102T140405Z.bak")
	require.NoError(t, os.WriteFile(backup, []byte("older"), 0o600))

	_, err := main.ReplaceFile(path, []byte("old"), []byte("new"), now)
	require.Error(t, err)
	assert.ErrorContains(t, err, backup+" exists already; not overwriting it, and "+path+" is left as it is")
	for p, want := range map[string]string{path: "old", backup: "older"} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
	}

	got, err := main.ReplaceFile(path, []byte("old"), []byte("new"), now.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "config.20260102T140406Z.bak"), got)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "new", string(b))
}

func TestKubeconfigOut(t *testing.T) {
	dir := t.TempDir()
	in := writeKubeconfig(t, dir, "in/config", kubeconfigYAML("k", map[string]string{"k": "{server: 'https://api.example.com', certificate-authority: ca.crt}"}, ""))
	out := filepath.Join(dir, "out", "config")
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))

	code, stdout, stderr := runKubeconfig(t, env(), "--kubeconfig="+in, "--out="+out)
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "wrote "+out)
	fi, err := os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	cfg, err := clientcmd.LoadFromFile(out)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "in", "ca.crt"), cfg.Clusters["k"].CertificateAuthority)

	// Over an existing file: its mode stays.
	require.NoError(t, os.Chmod(out, 0o640))
	code, _, stderr = runKubeconfig(t, env(), "--kubeconfig="+in, "--out="+out)
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	fi, err = os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), fi.Mode().Perm())

	// Already localproxy: --out still gets the kubeconfig.
	out2 := filepath.Join(dir, "out", "again")
	code, _, stderr = runKubeconfig(t, env(), "--kubeconfig="+out, "--out="+out2)
	require.Equal(t, main.ExitOK, code, "stderr: %s", stderr)
	assert.Contains(t, stderr, "nothing to change")
	again, err := clientcmd.LoadFromFile(out2)
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:7445", again.Clusters["k"].Server)
}

func TestKubeconfigErrors(t *testing.T) {
	dir := t.TempDir()
	good := writeKubeconfig(t, dir, "good", kubeconfigYAML("k", map[string]string{"k": "{server: 'https://api.example.com'}"}, ""))
	file := func(name, current string, clusters map[string]string, extra string) string {
		return writeKubeconfig(t, dir, name, kubeconfigYAML(current, clusters, extra))
	}
	one := func(name, cluster string) string { return file(name, "k", map[string]string{"k": cluster}, "") }
	missing := filepath.Join(dir, "missing")
	notKubeconfig := writeKubeconfig(t, dir, "not-kubeconfig", "clusters: 42\n")
	noCurrent := file("no-current", "", map[string]string{"a": "{server: 'https://a'}", "b": "{server: 'https://b'}"}, "")
	dangling := file("dangling", "gone", map[string]string{"a": "{server: 'https://a'}"}, "")
	noCluster := writeKubeconfig(t, dir, "no-cluster", "apiVersion: v1\nkind: Config\ncontexts:\n- name: c\n  context: {cluster: nowhere, user: u}\ncurrent-context: c\n")
	empty := writeKubeconfig(t, dir, "empty", "")
	httpServer := one("http", "{server: 'http://api.example.com:8080'}")
	noScheme := one("no-scheme", "{server: '10.0.0.1:6443'}")
	withPath := one("path", "{server: 'https://rancher.example.com/k8s/clusters/c-1'}")
	insecure := one("insecure", "{server: 'https://api.example.com', insecure-skip-tls-verify: true}")
	proxied := one("proxied", "{server: 'https://api.example.com', proxy-url: 'http://proxy:3128'}")
	noName := one("no-name", "{server: 'https://127.0.0.1:7445'}")

	tests := []struct {
		name string
		args []string
		env  []string
		code int
		// want lists what the message must say.
		want []string
	}{
		{"no --kubeconfig", nil, []string{"LOCALPROXY_KUBECONFIG", good}, main.ExitUsage,
			[]string{`localproxy kubeconfig: invalid --kubeconfig="": want the kubeconfig file to rewrite, e.g. --kubeconfig=/etc/kubernetes/kubelet.conf`}},
		{"missing file", []string{"--kubeconfig=" + missing}, nil, main.ExitUsage,
			[]string{`invalid --kubeconfig="` + missing + `": open ` + missing + ": no such file or directory; want a readable kubeconfig file"}},
		{"not a kubeconfig", []string{"--kubeconfig=" + notKubeconfig}, nil, main.ExitUsage,
			[]string{`invalid --kubeconfig="` + notKubeconfig + `": not a kubeconfig: `}},
		{"empty file", []string{"--kubeconfig=" + empty}, nil, main.ExitUsage,
			[]string{empty + " has no current-context; want a kubeconfig with a context"}},
		{"no current context", []string{"--kubeconfig=" + noCurrent}, nil, main.ExitUsage,
			[]string{noCurrent + ` has no current-context; want --context naming one of its contexts: "a", "b"`}},
		{"current context names nothing", []string{"--kubeconfig=" + dangling}, nil, main.ExitUsage,
			[]string{dangling + `: its current-context "gone" names no context in the file; want --context naming one of its contexts: "a"`}},
		{"unknown context", []string{"--kubeconfig=" + noCurrent, "--context=c"}, nil, main.ExitUsage,
			[]string{noCurrent + ` has no context "c" (--context); want one of its contexts: "a", "b"`}},
		{"context without its cluster", []string{"--kubeconfig=" + noCluster}, nil, main.ExitUsage,
			[]string{noCluster + `: context "c" names cluster "nowhere", which the file does not define`}},
		{"http server", []string{"--kubeconfig=" + httpServer}, nil, main.ExitUsage,
			[]string{httpServer + `: cluster "k" (context "k") has server "http://api.example.com:8080"; want an https:// URL`}},
		{"server without scheme", []string{"--kubeconfig=" + noScheme}, nil, main.ExitUsage,
			[]string{`has server "10.0.0.1:6443"; want an https:// URL`}},
		{"server with a path", []string{"--kubeconfig=" + withPath}, nil, main.ExitUsage,
			[]string{`has server "https://rancher.example.com/k8s/clusters/c-1" with a path; want https://host[:port]`}},
		{"insecure-skip-tls-verify", []string{"--kubeconfig=" + insecure}, nil, main.ExitUsage,
			[]string{insecure + `: cluster "k" (context "k") sets insecure-skip-tls-verify: through localproxy its credentials would go, unverified, to whatever listens on 127.0.0.1:7445`,
				"want certificate-authority or certificate-authority-data"}},
		{"proxy-url", []string{"--kubeconfig=" + proxied}, nil, main.ExitUsage,
			[]string{`sets proxy-url "http://proxy:3128"`}},
		{"already localproxy without a name", []string{"--kubeconfig=" + noName}, nil, main.ExitUsage,
			[]string{"already points at https://127.0.0.1:7445 but has no tls-server-name", "want --tls-server-name"}},
		{"out and in-place", []string{"--kubeconfig=" + good, "--in-place", "--out=" + filepath.Join(dir, "x")}, nil, main.ExitUsage,
			[]string{"with --in-place: want one of them"}},
		{"out is the input", []string{"--kubeconfig=" + good, "--out=" + good}, nil, main.ExitUsage,
			[]string{`invalid --out="` + good + `": it is the --kubeconfig file; want another file, or --in-place`}},
		{"bad tls-server-name", []string{"--kubeconfig=" + good, "--tls-server-name=bad_name"}, nil, main.ExitUsage,
			[]string{`invalid --tls-server-name="bad_name": want a DNS name or an IP address`}},
		{"bad port from env", []string{"--kubeconfig=" + good}, []string{"LOCALPROXY_BIND_PORT", "0"}, main.ExitUsage,
			[]string{"invalid LOCALPROXY_BIND_PORT=0 (--bind-port): want a port number 1-65535"}},
		{"bad bind address", []string{"--kubeconfig=" + good, "--bind-address=localhost"}, nil, main.ExitUsage,
			[]string{`invalid --bind-address="localhost": want an IP address`}},
		{"positional file", []string{good}, nil, main.ExitUsage,
			[]string{`unexpected argument "` + good + `"; localproxy kubeconfig takes flags only (see 'localproxy kubeconfig --help')`}},
		{"main flag", []string{"--kubeconfig=" + good, "--endpoints=10.0.0.1:6443"}, nil, main.ExitUsage,
			[]string{"unknown flag --endpoints; want one of the flags 'localproxy kubeconfig --help' lists"}},
		{"unwritable out", []string{"--kubeconfig=" + good, "--out=" + filepath.Join(missing, "config")}, nil, 1,
			[]string{"writing " + filepath.Join(missing, "config") + ": "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runKubeconfig(t, env(tc.env...), tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			assert.Empty(t, stdout)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
		})
	}
}

func TestKubeconfigHelp(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, main.ExitOK, main.Run(t.Context(), []string{"kubeconfig", "-help"}, env(), io.Discard, &stderr))
	for _, w := range []string{"Usage: localproxy kubeconfig --kubeconfig=FILE", "tls-server-name", "insecure-skip-tls-verify",
		"FILE.<UTC time>.bak", "  --in-place ", "  --bind-port int ", "LOCALPROXY_TLS_SERVER_NAME"} {
		assert.Contains(t, stderr.String(), w)
	}
	stderr.Reset()
	assert.Equal(t, main.ExitOK, main.Run(t.Context(), []string{"--help"}, env(), io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "localproxy kubeconfig --kubeconfig=FILE")
}
