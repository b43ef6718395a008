package testbed

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
)

const (
	// APIServerPort is the secure port of every apiserver.
	APIServerPort = 6443
	// MaxAPIServers is how many apiservers a bed can hold: the serving
	// certificate covers 10.250.0.1 to 10.250.0.MaxAPIServers.
	MaxAPIServers = 9
)

// apiserverHost is the address of apiserver k (1-based).
func apiserverHost(k int) string { return fmt.Sprintf("10.250.0.%d", k) }

// APIServer is one kube-apiserver of a bed. Its methods are safe for
// concurrent use; the fault methods are idempotent.
type APIServer struct {
	bed   *Bed
	index int
	name  string
	host  string

	mu   sync.Mutex // guards proc, hung, shim and cert
	proc *process   // current or last process; nil before the first start
	hung bool       // SIGSTOPped
	shim *shim      // the relay of Slow; nil when not slow
	// oldShims are relays Fast left to their connections (closed by
	// Bed.Close).
	oldShims []*shim
	// cert is the serving pair of a certificate fault (see
	// RestartNotYetValid), nil for the shared good one.
	cert *servingCert

	csOnce sync.Once
	cs     kubernetes.Interface // admin clientset talking to this server only
	csErr  error
}

// Name is "apiserver-K".
func (s *APIServer) Name() string { return s.name }

// Index is K, the last octet of the address.
func (s *APIServer) Index() int { return s.index }

// Host is the IP address, "10.250.0.K".
func (s *APIServer) Host() string { return s.host }

// Addr is "10.250.0.K:6443".
func (s *APIServer) Addr() string {
	return net.JoinHostPort(s.host, strconv.Itoa(APIServerPort))
}

// URL is "https://10.250.0.K:6443".
func (s *APIServer) URL() string { return "https://" + s.Addr() }

// LogFile is the path of this server's log (all its runs, appended).
func (s *APIServer) LogFile() string {
	return filepath.Join(s.bed.dir, s.name+".log")
}

// PID of the current (or last) process; 0 before the first start.
func (s *APIServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Running reports whether the process is alive (possibly hung).
func (s *APIServer) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *APIServer) runningLocked() bool {
	if s.proc == nil {
		return false
	}
	done, _ := s.proc.exited()
	return !done
}

// Clientset returns an admin clientset that talks to this server only
// (5 s request timeout, no client-side rate limit).
func (s *APIServer) Clientset() (kubernetes.Interface, error) {
	s.csOnce.Do(func() {
		cfg := s.bed.RESTConfig(Direct(s.index))
		cfg.Timeout = 5 * time.Second
		cfg.QPS = -1 // polled every 100 ms while waiting
		s.cs, s.csErr = kubernetes.NewForConfig(cfg)
	})
	return s.cs, s.csErr
}

// argsLocked is the command line; s.mu is held.
func (s *APIServer) argsLocked() []string {
	b := s.bed
	serving := b.pki.serving
	if s.cert != nil {
		serving = s.cert.pair
	}
	args := []string{
		"--etcd-servers=" + b.etcd.clientURL,
		"--bind-address=" + s.host,
		"--advertise-address=" + s.host,
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--tls-cert-file=" + serving.certFile,
		"--tls-private-key-file=" + serving.keyFile,
		"--client-ca-file=" + b.pki.ca.certFile,
		"--token-auth-file=" + b.tokenFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-key-file=" + b.pki.sa.keyFile,
		"--service-account-signing-key-file=" + b.pki.sa.keyFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--endpoint-reconciler-type=lease",
		"--shutdown-delay-duration=" + b.shutdownDelay.String(),
		"--shutdown-send-retry-after=true",
		"--cert-dir=" + filepath.Join(b.dir, s.name),
		"--profiling=false",
		"--v=1",
	}
	return append(args, b.opts.ExtraAPIServerArgs...)
}

// start launches the process. The caller waits for readiness.
func (s *APIServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		return nil
	}
	var cred *syscall.Credential
	if s.bed.exempt {
		// Root keeps every file readable; the group only tags sockets.
		cred = &syscall.Credential{Uid: 0, Gid: APIServerGID, NoSetGroups: true}
	}
	proc, err := startProcess(s.name, s.LogFile(), s.bed.kube.apiserver, s.argsLocked(), cred)
	if err != nil {
		return err
	}
	s.proc = proc
	s.hung = false
	s.bed.procs.add(proc)
	return nil
}

// current returns the current process, nil if never started.
func (s *APIServer) current() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Readyz asks this server's /readyz (fresh connection, 2 s timeout) and
// returns nil when it answers 200.
func (s *APIServer) Readyz(ctx context.Context) error {
	return s.readyz(ctx, s.bed.probe)
}

// readyz asks /readyz through probe.
func (s *APIServer) readyz(ctx context.Context, probe *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := probe.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 8192))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s: %s", resp.Status, failedChecks(string(body)))
	}
	return nil
}

// failedChecks keeps the "[-]..." lines of a /readyz body.
func failedChecks(body string) string {
	var failed []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, l)
		}
	}
	if len(failed) == 0 {
		return strings.TrimSpace(body)
	}
	return strings.Join(failed, "; ")
}

// waitReady polls /readyz until it answers 200, for up to the bed's
// readyTimeout. It fails at once, with the log tail, when the process
// exits.
func (s *APIServer) waitReady(ctx context.Context) error {
	return s.waitReadyWithin(ctx, s.bed.readyTimeout)
}

// waitReadyWithin is waitReady for up to timeout.
func (s *APIServer) waitReadyWithin(ctx context.Context, timeout time.Duration) error {
	proc := s.current()
	err := poll(ctx, timeout, fmt.Sprintf("kube-apiserver at %s not ready", s.host), func(ctx context.Context) (bool, error) {
		if done, _ := proc.exited(); done {
			return false, stopPolling(proc.exitedError())
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		// A server with a certificate fault is ready when it answers;
		// its certificate is the fault.
		probe := s.bed.probe
		if s.CertFault() != "" {
			probe = s.bed.probeUnverified
		}
		if err := s.readyz(pctx, probe); err != nil {
			return false, err
		}
		return true, nil
	})
	if err != nil && !strings.Contains(err.Error(), "last lines of") {
		err = fmt.Errorf("%w; last lines of %s:\n%s", err, proc.logPath, proc.tail())
	}
	return err
}
