package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

// testExport: localproxy's export keeps a real HAProxy's backend equal to
// the healthy apiservers (the kube-service-exporter pattern): the shipped
// HAProxy template is rendered to a file HAProxy loads, and HAProxy is
// reloaded (master-worker, SIGUSR2) by --export-command. As an apiserver is
// killed and comes back, the running HAProxy's servers (asked on its admin
// socket) follow, and kubectl through HAProxy keeps working.
func testExport(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		if bedtest.Strict() {
			t.Fatalf("haproxy not installed (hack/tools/ensure-deps.sh installs it): %v", err)
		}
		t.Skipf("haproxy not installed: %v", err)
	}
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 3)
	proxyPort, healthPort, lbPort := ports[0], ports[1], ports[2]
	backend := filepath.Join(dir, "backend.cfg")
	pidFile := filepath.Join(dir, "haproxy.pid")
	adminSock := filepath.Join(dir, "admin.sock")

	var eps []string
	for _, s := range bed.APIServers() {
		eps = append(eps, s.Addr())
	}
	lp := startProcess(t, filepath.Join(dir, "localproxy.log"), bin,
		"--endpoints="+strings.Join(eps, ","),
		"--bind-port="+strconv.Itoa(proxyPort),
		"--health-port="+strconv.Itoa(healthPort),
		"--ca-file="+bed.CAFile(),
		"--tls-server-name="+bed.OriginName(),
		"--enable-discovery=false",
		"--export-template="+filepath.Join(root, "cmd", "localproxy", "deploy", "export", "haproxy-backend.tmpl"),
		"--export-file="+backend,
		// Before HAProxy runs there is nothing to reload.
		"--export-command=test ! -e "+pidFile+" || kill -USR2 \"$(cat "+pidFile+")\"",
		"--export-debounce=200ms",
		"--shutdown-timeout=0",
	)
	e := &env{t: t, ctx: ctx, bed: bed}
	exported := func() []string { return backendServers(t, backend) }
	if err := e.waitFor("every apiserver in the exported backend", observeLimit, func() bool {
		return slices.Equal(exported(), sorted(eps))
	}); err != nil {
		t.Fatalf("%v: %v\nlocalproxy log:\n%s", err, exported(), lp.log())
	}

	mainCfg := filepath.Join(dir, "haproxy.cfg")
	cfg := fmt.Sprintf(`global
    stats socket %s mode 600 level admin
defaults
    mode tcp
    timeout connect 2s
    timeout client 5m
    timeout server 5m
    retries 3
    option redispatch
frontend api
    bind 127.0.0.1:%d
    default_backend kube-apiserver
`, adminSock, lbPort)
	if err := os.WriteFile(mainCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	hp := startProcess(t, filepath.Join(dir, "haproxy.log"), haproxy, "-W", "-db", "-p", pidFile, "-f", mainCfg, "-f", backend)
	running := func() []string { return haproxyServers(adminSock) }
	if err := e.waitFor("HAProxy serving every apiserver", observeLimit, func() bool {
		return slices.Equal(running(), sorted(eps))
	}); err != nil {
		t.Fatalf("%v: %v\nHAProxy log:\n%s", err, running(), hp.log())
	}

	kubeconfig := filepath.Join(dir, "haproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	pointAt(t, kubeconfig, "https://127.0.0.1:"+strconv.Itoa(lbPort))
	const ns = "export-haproxy"
	if _, err := kubectlAt(ctx, bed, kubeconfig, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	rounds := kubectlRounds(t, ctx, bed, kubeconfig, ns, "export", 0)

	victim := bed.APIServers()[0]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	rest := sorted(slices.DeleteFunc(slices.Clone(eps), func(a string) bool { return a == victim.Addr() }))
	if err := e.waitFor("HAProxy's servers without the killed "+victim.Addr(), observeLimit, func() bool {
		return slices.Equal(exported(), rest) && slices.Equal(running(), rest)
	}); err != nil {
		t.Fatalf("%v: exported %v, running %v\nlocalproxy log:\n%s\nHAProxy log:\n%s", err, exported(), running(), lp.log(), hp.log())
	}
	rounds += kubectlRounds(t, ctx, bed, kubeconfig, ns, "export-killed", 2*time.Second)

	if err := bed.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.waitFor("HAProxy's servers with "+victim.Addr()+" back", observeLimit, func() bool {
		return slices.Equal(exported(), sorted(eps)) && slices.Equal(running(), sorted(eps))
	}); err != nil {
		t.Fatalf("%v: exported %v, running %v\nlocalproxy log:\n%s", err, exported(), running(), lp.log())
	}
	rounds += kubectlRounds(t, ctx, bed, kubeconfig, ns, "export-back", 0)
	t.Logf("%d kubectl rounds through HAProxy, none failed; backend exported and reloaded as %s went and came back", rounds, victim.Addr())
}

// backendServers returns the sorted host:port of the server lines of an
// exported HAProxy backend file.
func backendServers(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "server" {
			out = append(out, f[2])
		}
	}
	return sorted(out)
}

// haproxyServers asks HAProxy's admin socket for the servers of the
// running kube-apiserver backend, as sorted host:port.
func haproxyServers(sock string) []string {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprint(c, "show servers state kube-apiserver\n"); err != nil {
		return nil
	}
	// Lines: be_id be_name srv_id srv_name srv_addr ... srv_port is the
	// 19th field (HAProxy 2.x, format version 1).
	var out []string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 19 || strings.HasPrefix(f[0], "#") {
			continue
		}
		out = append(out, net.JoinHostPort(f[4], f[18]))
	}
	return sorted(out)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// pointAt rewrites the server of every cluster in kubeconfig.
func pointAt(t *testing.T, kubeconfig, server string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// freePorts returns n TCP ports free on 127.0.0.1 a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// process is a command started by startProcess, its output in a file.
type process struct {
	cmd     *exec.Cmd
	logFile string
}

func (p *process) log() string {
	b, _ := os.ReadFile(p.logFile)
	return string(b)
}

// startProcess starts name with args, output to logFile, and stops it
// (SIGTERM, then SIGKILL after 10s) when the test ends.
func startProcess(t *testing.T, logFile, name string, args ...string) *process {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("%s did not exit within 10s of SIGTERM", filepath.Base(name))
		}
	})
	return &process{cmd: cmd, logFile: logFile}
}
