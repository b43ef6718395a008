package testbed_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
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

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

func TestMain(m *testing.M) { bedtest.Main(m, nil) }

func startBed(t *testing.T, ctx context.Context, opts testbed.Options) *testbed.Bed {
	t.Helper()
	return bedtest.Start(t, ctx, opts)
}

// freshClient is an admin clientset for apiserver s with its own
// transport (a Dial func of its own keeps client-go from sharing cached
// connections) and a short timeout.
func freshClient(t *testing.T, bed *testbed.Bed, s *testbed.APIServer, timeout time.Duration) kubernetes.Interface {
	t.Helper()
	cfg := bed.RESTConfig(testbed.Direct(s.Index()))
	cfg.Timeout = timeout
	cfg.Dial = (&net.Dialer{}).DialContext
	cfg.WarningHandler = rest.NoWarnings{}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// call makes one cheap authenticated request.
func call(ctx context.Context, cs kubernetes.Interface) error {
	_, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) ||
		strings.Contains(err.Error(), "Client.Timeout exceeded") ||
		strings.Contains(err.Error(), "context deadline exceeded")
}

// expect fails unless call against a fresh client of s fails as want says.
func expectFailure(t *testing.T, ctx context.Context, bed *testbed.Bed, s *testbed.APIServer, what string, want func(error) bool) {
	t.Helper()
	began := time.Now()
	err := call(ctx, freshClient(t, bed, s, 2*time.Second))
	if err == nil {
		t.Fatalf("%s: request to %s succeeded", what, s.Addr())
	}
	if !want(err) {
		t.Fatalf("%s: request to %s: unexpected error (%T): %v", what, s.Addr(), err, err)
	}
	t.Logf("%s: request to %s failed after %s: %v", what, s.Addr(), time.Since(began).Round(time.Millisecond), err)
}

func expectWorks(t *testing.T, ctx context.Context, bed *testbed.Bed, s *testbed.APIServer) {
	t.Helper()
	if err := call(ctx, freshClient(t, bed, s, 5*time.Second)); err != nil {
		t.Fatalf("request to %s: %v", s.Addr(), err)
	}
}

func addrs(servers []*testbed.APIServer) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Addr())
	}
	return out
}

// childPIDs lists the processes whose parent is this process.
func childPIDs(t *testing.T) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may contain spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == os.Getpid() {
			pid, _ := strconv.Atoi(strings.Fields(s)[0])
			pids = append(pids, pid)
		}
	}
	return pids
}

func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

func TestSmoke(t *testing.T) {
	// The bed may wait for the machine's test bed lock while the e2e
	// package (run beside this one by go test ./hack/...) holds it: the
	// 10 minutes the smoke test may take start once the bed is up, and go
	// test's -timeout bounds the wait.
	bed := startBed(t, t.Context(), testbed.Options{APIServers: 3})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	servers := bed.APIServers()
	if len(servers) != 3 {
		t.Fatalf("APIServers() = %d servers, want 3", len(servers))
	}

	t.Run("endpointslice lists all", func(t *testing.T) {
		got, err := bed.ReadyEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"10.250.0.1:6443", "10.250.0.2:6443", "10.250.0.3:6443"}
		if !slices.Equal(got, want) {
			t.Fatalf("ready endpoints %v, want %v", got, want)
		}
		for _, s := range servers {
			if err := s.Readyz(ctx); err != nil {
				t.Errorf("%s: %v", s.Name(), err)
			}
			expectWorks(t, ctx, bed, s)
		}
	})

	// apifailover's probes resume TLS sessions; kube-apiserver must issue
	// session tickets for that to save anything. One cache per server: a
	// ticket resumes only on the server that issued it.
	t.Run("TLS session resumption", func(t *testing.T) {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(bed.CAPEM())
		for _, s := range servers {
			cfg := &tls.Config{RootCAs: roots, ServerName: bed.OriginName(), ClientSessionCache: tls.NewLRUClientSessionCache(1)}
			var resumed []bool
			for range 2 {
				c, err := tls.Dial("tcp", s.Addr(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				// TLS 1.3 tickets arrive after the handshake: read until
				// the server has sent them (an HTTP/1.1 request does it).
				io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: "+bed.OriginName()+"\r\nConnection: close\r\n\r\n")
				io.Copy(io.Discard, c)
				resumed = append(resumed, c.ConnectionState().DidResume)
				c.Close()
			}
			if !slices.Equal(resumed, []bool{false, true}) {
				t.Errorf("%s: resumed %v on two handshakes, want [false true]", s.Name(), resumed)
			}
		}
	})

	t.Run("kubectl", func(t *testing.T) {
		out, err := bed.Kubectl(ctx, "get", "endpointslices", "-n", "default",
			"-l", discoveryv1.LabelServiceName+"=kubernetes", "-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(out); len(got) != 3 {
			t.Fatalf("kubectl lists %q, want 3 addresses", out)
		}
		if _, err := os.Stat(bed.KubeconfigPath(testbed.Origin)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("identities", func(t *testing.T) {
		nodeCfg := bed.RESTConfigAs(testbed.Origin, testbed.Node)
		nodeCfg.WarningHandler = rest.NoWarnings{} // "v1 Endpoints is deprecated"
		node, err := kubernetes.NewForConfig(nodeCfg)
		if err != nil {
			t.Fatal(err)
		}
		// Node authorizer + NodeRules: get core endpoints, nothing on slices.
		if _, err := node.CoreV1().Endpoints(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			t.Errorf("node get endpoints/kubernetes: %v", err)
		}
		if _, err := node.CoreV1().Services(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("node list services: %v", err)
		}
		_, err = node.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("node list endpointslices: got %v, want Forbidden", err)
		}
		lpCfg := bed.RESTConfigAs(testbed.Origin, testbed.LocalProxyIdentity)
		lpCfg.WarningHandler = rest.NoWarnings{}
		lp, err := kubernetes.NewForConfig(lpCfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lp.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("localproxy list endpointslices: %v", err)
		}
		if _, err := lp.CoreV1().Endpoints(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			t.Errorf("localproxy get endpoints/kubernetes: %v", err)
		}
		if _, err := lp.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("localproxy list secrets: got %v, want Forbidden", err)
		}
	})

	s := servers[1]
	// heal undoes whatever a failed subtest left on s.
	heal := func(t *testing.T) {
		t.Cleanup(func() {
			if err := errors.Join(s.Resume(), s.Restore()); err != nil {
				t.Errorf("heal %s: %v", s.Name(), err)
			}
			if !s.Running() {
				if err := s.Restart(ctx); err != nil {
					t.Errorf("heal %s: %v", s.Name(), err)
				}
			}
		})
	}

	t.Run("kill", func(t *testing.T) {
		heal(t)
		pid := s.PID()
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
		if alive(pid) {
			t.Fatalf("pid %d alive after Kill", pid)
		}
		if err := s.Kill(); err != nil {
			t.Fatalf("second Kill: %v", err)
		}
		expectFailure(t, ctx, bed, s, "killed", func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) })

		began := time.Now()
		others := []string{servers[0].Addr(), servers[2].Addr()}
		if err := bed.WaitEndpoints(ctx, others, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("fact: SIGKILLed %s left the EndpointSlice after %s", s.Addr(), time.Since(began).Round(100*time.Millisecond))

		began = time.Now()
		if err := s.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("restart took %s", time.Since(began).Round(100*time.Millisecond))
		if s.PID() == pid {
			t.Fatalf("Restart kept pid %d", pid)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("blackhole", func(t *testing.T) {
		heal(t)
		established := freshClient(t, bed, s, 2*time.Second)
		if err := call(ctx, established); err != nil {
			t.Fatal(err)
		}
		if err := s.Blackhole(); err != nil {
			t.Fatal(err)
		}
		if err := call(ctx, established); err == nil || !isTimeout(err) {
			t.Fatalf("established connection: got %v, want a timeout", err)
		}
		if err := s.Blackhole(); err != nil {
			t.Fatalf("second Blackhole: %v", err)
		}
		if got := s.NetworkFault(); got != "blackhole" {
			t.Fatalf("NetworkFault() = %q", got)
		}
		expectFailure(t, ctx, bed, s, "blackholed", isTimeout)
		// The apiserver's own (loopback) connections are exempt, as on a
		// real host: it keeps its lease and stays listed.
		if bed.LoopbackExempt() {
			if err := tcpConnect(ctx, s.Addr(), testbed.APIServerGID); err != nil {
				t.Errorf("connect as group %d (apiserver loopback): %v", testbed.APIServerGID, err)
			}
			if err := tcpConnect(ctx, s.Addr(), 0); err == nil {
				t.Errorf("connect as group 0 through the blackhole succeeded")
			}
		}
		if err := s.Restore(); err != nil {
			t.Fatal(err)
		}
		if err := s.Restore(); err != nil {
			t.Fatalf("second Restore: %v", err)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("reject", func(t *testing.T) {
		heal(t)
		established := freshClient(t, bed, s, 2*time.Second)
		if err := call(ctx, established); err != nil {
			t.Fatal(err)
		}
		if err := s.Reject(); err != nil {
			t.Fatal(err)
		}
		if got := s.NetworkFault(); got != "reject" {
			t.Fatalf("NetworkFault() = %q", got)
		}
		err := call(ctx, established)
		if err == nil || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)) {
			t.Fatalf("established connection: got %v, want reset or refused", err)
		}
		t.Logf("rejected, established connection: %v", err)
		expectFailure(t, ctx, bed, s, "rejected", func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) })
		if err := s.Restore(); err != nil {
			t.Fatal(err)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("hang", func(t *testing.T) {
		heal(t)
		if err := s.Hang(); err != nil {
			t.Fatal(err)
		}
		if !s.Hung() {
			t.Fatal("Hung() = false after Hang")
		}
		expectFailure(t, ctx, bed, s, "hung", isTimeout)
		if err := s.Resume(); err != nil {
			t.Fatal(err)
		}
		if err := s.Resume(); err != nil {
			t.Fatalf("second Resume: %v", err)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("graceful stop", func(t *testing.T) {
		heal(t)
		began := time.Now()
		if err := s.Terminate(); err != nil {
			t.Fatal(err)
		}
		// While shutting down the server still answers, with /readyz failing.
		var sawNotReady time.Duration
		err := pollUntil(ctx, 30*time.Second, func() bool {
			err := s.Readyz(ctx)
			if err != nil && strings.Contains(err.Error(), "/readyz:") {
				sawNotReady = time.Since(began)
				return true
			}
			return false
		})
		if err != nil {
			t.Fatalf("never saw /readyz answer not-ready: %v", err)
		}
		t.Logf("fact: /readyz failed %s after SIGTERM: %v", sawNotReady.Round(time.Millisecond), s.Readyz(ctx))
		if !s.Running() {
			t.Fatal("process gone before the shutdown delay")
		}
		others := []string{servers[0].Addr(), servers[2].Addr()}
		if err := bed.WaitEndpoints(ctx, others, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("fact: terminated %s left the EndpointSlice %s after SIGTERM", s.Addr(), time.Since(began).Round(time.Millisecond))
		if err := s.GracefulStop(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("fact: exited %s after SIGTERM", time.Since(began).Round(time.Millisecond))
		expectFailure(t, ctx, bed, s, "stopped", func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) })
		if err := s.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		expectWorks(t, ctx, bed, s)
	})

	grayFaults(t, ctx, bed, s)

	// etcd dying unasked (killed from outside, crashed) is no fault a
	// scenario injects: Heal starts it again on its data, and the
	// apiservers recover by themselves.
	t.Run("etcd revived by Heal", func(t *testing.T) {
		var etcdPID int
		for _, pid := range childPIDs(t) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "etcd" {
				etcdPID = pid
			}
		}
		if etcdPID == 0 {
			t.Fatalf("no etcd among the children %v", childPIDs(t))
		}
		if err := syscall.Kill(etcdPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := pollUntil(ctx, 30*time.Second, func() bool { return !slices.Contains(childPIDs(t), etcdPID) }); err != nil {
			t.Fatalf("etcd (pid %d) not reaped: %v", etcdPID, err)
		}
		began := time.Now()
		if err := bed.Heal(ctx); err != nil {
			t.Fatalf("Heal with etcd gone: %v", err)
		}
		t.Logf("fact: Heal restarted etcd and every apiserver was ready %s later", time.Since(began).Round(time.Millisecond))
		cs := freshClient(t, bed, servers[1], 10*time.Second)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "after-etcd-restart-"}}
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("a write after etcd's restart: %v", err)
		}
	})

	// An apiserver that runs but is not ready (one started on a starved
	// machine can stay so for minutes) fails no heal: Heal starts it
	// again. Stopped from outside (SIGSTOP, not Hang: Heal does not
	// resume it), it answers nothing.
	t.Run("a running apiserver that is not ready is started again by Heal", func(t *testing.T) {
		s := servers[2]
		pid := s.PID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(pid, syscall.SIGCONT) // if Heal left it
		began := time.Now()
		if err := bed.Heal(ctx); err != nil {
			t.Fatalf("Heal with %s stopped: %v", s.Name(), err)
		}
		if s.PID() == pid {
			t.Fatalf("%s (pid %d) was not started again", s.Name(), pid)
		}
		t.Logf("fact: Heal started %s again and it was ready %s later", s.Name(), time.Since(began).Round(time.Millisecond))
		cs := freshClient(t, bed, s, 10*time.Second)
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Fatalf("a GET from %s after Heal: %v", s.Name(), err)
		}
	})

	t.Run("add and remove", func(t *testing.T) {
		began := time.Now()
		added, err := bed.AddAPIServer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("AddAPIServer %s took %s", added.Addr(), time.Since(began).Round(time.Millisecond))
		if added.Addr() != "10.250.0.4:6443" {
			t.Fatalf("added %s, want 10.250.0.4:6443", added.Addr())
		}
		if err := bed.WaitEndpoints(ctx, addrs(bed.APIServers()), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		expectWorks(t, ctx, bed, added)

		began = time.Now()
		if err := bed.RemoveAPIServer(ctx, added); err != nil {
			t.Fatal(err)
		}
		t.Logf("RemoveAPIServer took %s", time.Since(began).Round(time.Millisecond))
		if err := bed.RemoveAPIServer(ctx, added); err != nil {
			t.Fatalf("second RemoveAPIServer: %v", err)
		}
		if got := addrs(bed.APIServers()); !slices.Equal(got, addrs(servers)) {
			t.Fatalf("members after remove: %v", got)
		}
		if err := bed.WaitEndpoints(ctx, addrs(servers), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("close restores everything", func(t *testing.T) {
		// Leave faults behind: Close must undo them.
		if err := servers[0].Hang(); err != nil {
			t.Fatal(err)
		}
		if err := servers[2].Blackhole(); err != nil {
			t.Fatal(err)
		}
		var pids []int
		for _, s := range servers {
			pids = append(pids, s.PID())
		}
		if len(childPIDs(t)) < 4 {
			t.Fatalf("expected etcd + 3 apiservers as children, have %v", childPIDs(t))
		}
		if err := bed.Close(); err != nil {
			t.Fatal(err)
		}
		if err := bed.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if kids := childPIDs(t); len(kids) != 0 {
			t.Fatalf("children left after Close: %v", kids)
		}
		for _, pid := range pids {
			if alive(pid) {
				t.Errorf("pid %d alive after Close", pid)
			}
		}
		out, err := exec.CommandContext(ctx, sbin("iptables"), "-w", "5", "-S").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables -S: %v: %s", err, out)
		}
		if strings.Contains(string(out), "apifailover-testbed") {
			t.Errorf("iptables rules left after Close:\n%s", out)
		}
		out, err = exec.CommandContext(ctx, sbin("ip"), "-4", "addr", "show", "dev", "lo").CombinedOutput()
		if err != nil {
			t.Fatalf("ip addr: %v: %s", err, out)
		}
		if strings.Contains(string(out), "10.250.0.") {
			t.Errorf("addresses left on lo after Close:\n%s", out)
		}
	})
}

// pollUntil checks cond every 50 ms until it holds, ctx ends or timeout
// passes.
func pollUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// tcpConnect opens a TCP connection to addr from a bash running as group
// gid, within 2 s.
func tcpConnect(ctx context.Context, addr string, gid uint32) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%s", host, port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: gid, NoSetGroups: true}}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sbin finds an administration tool also when /usr/sbin is not in PATH.
func sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name)
		}
	}
	return name
}
