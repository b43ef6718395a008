package e2e_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apifailover/apifailover/hack/testbed"
)

// testKubeconfigSubcommand: a kubeconfig as a user has it (the first
// apiserver's address, the CA and the token in files beside it, named
// relative to it, no tls-server-name) is rewritten by the built binary's
// "localproxy kubeconfig" into another directory, and the real kubectl
// works with the result through localproxy, also once the apiserver the
// original names is killed.
func testKubeconfigSubcommand(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)

	origin := bed.APIServers()[0]
	userDir := filepath.Join(dir, "user")
	if err := os.MkdirAll(filepath.Join(userDir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"pki/ca.crt": bed.CAPEM(), "token": []byte(bed.AdminToken())} {
		if err := os.WriteFile(filepath.Join(userDir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	userKubeconfig := filepath.Join(userDir, "config")
	if err := os.WriteFile(userKubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: https://`+origin.Addr()+`
    certificate-authority: pki/ca.crt
users:
- name: admin
  user:
    tokenFile: token
contexts:
- name: admin@testbed
  context: {cluster: testbed, user: admin}
current-context: admin@testbed
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cacheDir := t.TempDir()
	kubectl := func(kubeconfig string) error {
		_, err := kubectlAt(ctx, bed, kubeconfig, "--cache-dir="+cacheDir, "get", "namespaces", "-o", "name")
		return err
	}
	if err := kubectl(userKubeconfig); err != nil {
		t.Fatalf("the user's kubeconfig, straight to %s: %v", origin.Addr(), err)
	}

	// Rewritten into another directory: the relative paths must follow.
	nodeKubeconfig := filepath.Join(dir, "node", "kubeconfig")
	if err := os.MkdirAll(filepath.Dir(nodeKubeconfig), 0o700); err != nil {
		t.Fatal(err)
	}
	out := runLocalProxyKubeconfig(t, ctx, bin, "--kubeconfig="+userKubeconfig, "--out="+nodeKubeconfig)
	t.Logf("localproxy kubeconfig:\n%s", out)
	if want := `cluster "testbed" (context "admin@testbed"): server https://` + origin.Addr() + ` -> https://127.0.0.1:7445`; !strings.Contains(out, want) {
		t.Errorf("localproxy kubeconfig said %q; want %q", out, want)
	}
	cfg, err := clientcmd.LoadFromFile(nodeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Clusters["testbed"]
	host, _, err := net.SplitHostPort(origin.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != "https://"+proxyAddr || c.TLSServerName != host || c.CertificateAuthority != filepath.Join(userDir, "pki/ca.crt") ||
		cfg.AuthInfos["admin"].TokenFile != filepath.Join(userDir, "token") {
		t.Errorf("rewritten kubeconfig: server %q, tls-server-name %q, certificate-authority %q, tokenFile %q; want https://%s, %s and absolute paths in %s",
			c.Server, c.TLSServerName, c.CertificateAuthority, cfg.AuthInfos["admin"].TokenFile, proxyAddr, host, userDir)
	}
	// Once more on the result: nothing to change.
	out = runLocalProxyKubeconfig(t, ctx, bin, "--kubeconfig="+nodeKubeconfig, "--in-place")
	if !strings.Contains(out, "nothing to change") {
		t.Errorf("localproxy kubeconfig on its own output said %q; want nothing to change", out)
	}

	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	p := startLocalProxy(t, ctx, bed, reg, logs.logger(), connectOptions{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	waitProxyHealthy(t, ctx, bed, p)
	const accepted = "apifailover_localproxy_connections_accepted_total"
	through := func(what string) {
		t.Helper()
		before := counter(t, reg, accepted)
		if err := kubectl(nodeKubeconfig); err != nil {
			t.Fatalf("%s: kubectl with the rewritten kubeconfig: %v", what, err)
		}
		n := counter(t, reg, accepted) - before
		if n < 1 {
			t.Fatalf("%s: kubectl succeeded but localproxy accepted no connection", what)
		}
		t.Logf("%s: kubectl with the rewritten kubeconfig succeeded through localproxy (%d connections accepted)", what, n)
	}
	through("all apiservers up")

	if err := origin.Kill(); err != nil {
		t.Fatal(err)
	}
	// The original kubeconfig's one apiserver is gone; the rewritten
	// one goes on through the others.
	if err := kubectl(userKubeconfig); err == nil {
		t.Errorf("the user's kubeconfig still works with %s killed", origin.Addr())
	}
	through(origin.Addr() + " killed")
}

// runLocalProxyKubeconfig runs "localproxy kubeconfig" with args; it must
// succeed. It returns what the command wrote to stderr.
func runLocalProxyKubeconfig(t *testing.T, ctx context.Context, bin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, append([]string{"kubeconfig"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("localproxy kubeconfig %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if stdout.Len() > 0 {
		t.Errorf("localproxy kubeconfig %s wrote to stdout: %s", strings.Join(args, " "), stdout.String())
	}
	return stderr.String()
}
