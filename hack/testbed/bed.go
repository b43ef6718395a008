package testbed

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure Start. The zero value of every field is usable.
type Options struct {
	// APIServers is how many kube-apiservers to start, 1 to MaxAPIServers.
	// If zero, 3.
	APIServers int
	// Version of kube-apiserver and kubectl, "vX.Y.Z". If empty,
	// DefaultVersion. Built by hack/tools/build-kube.sh when not cached.
	Version string
	// Dir holds certificates, kubeconfigs, etcd data and one log per
	// process; it is left in place for inspection. If empty, a temporary
	// directory is created and removed by Close.
	Dir string
	// Log receives progress lines. If nil, they are discarded.
	Log io.Writer
	// ShutdownDelay is --shutdown-delay-duration: how long a terminated
	// apiserver keeps serving with /readyz failing. If zero, 2s. If
	// negative, 0.
	ShutdownDelay time.Duration
	// ReadyTimeout bounds each wait for readiness (etcd, one apiserver,
	// the EndpointSlice). If zero, 60s.
	ReadyTimeout time.Duration
	// KubeBinDir holds kube-apiserver and kubectl. If empty, the per-user
	// cache of hack/tools/build-kube.sh for Version.
	KubeBinDir string
	// EtcdPath is the etcd binary. If empty, etcd from PATH or /usr/sbin.
	EtcdPath string
	// InstallDeps lets Start run hack/tools/ensure-deps.sh (needs root)
	// when etcd, iptables or ip is missing. If false, Start fails with a
	// message naming the script.
	InstallDeps bool
	// LocalProxyAddr is where the LocalProxy target points. If empty,
	// 127.0.0.1:7445.
	LocalProxyAddr string
	// ExtraAPIServerArgs are appended to every kube-apiserver command line.
	ExtraAPIServerArgs []string
}

// Bed is a running control plane. Its methods are safe for concurrent use.
type Bed struct {
	opts           Options
	dir            string
	removeDir      bool
	log            io.Writer
	started        time.Time
	shutdownDelay  time.Duration
	readyTimeout   time.Duration
	localProxyAddr string

	tools     hostTools
	kube      kubeBinaries
	pki       *pki
	ids       map[Identity]identity
	tokenFile string
	etcd      *etcd
	probe     *http.Client // /readyz probes: fresh connection each, 2 s timeout
	// probeUnverified is probe without certificate checks, for servers
	// with a certificate fault.
	probeUnverified *http.Client
	procs           procGroup
	fw              *firewall
	addrs           *loAddrs
	exempt          bool // apiservers run as APIServerGID; their own connections escape faults

	mu         sync.Mutex // guards members, next, etcdPaused, etcd.proc
	etcdPaused bool
	closing    atomic.Bool // Close has begun: processes end as asked
	members    []*APIServer
	next       int // index of the next apiserver to add

	lock *os.File // machine-wide: one bed at a time (see acquireLock)

	closeOnce sync.Once
	closeErr  error
}

// Start brings up etcd and opts.APIServers kube-apiservers inside the
// private network namespace (see ReexecInNetns) and returns once every
// apiserver answers /readyz and the kubernetes EndpointSlice lists all of
// them Ready. Only one bed runs at a time on a machine: Start first waits
// (until ctx ends) for any other bed, in any process, to close. On error
// everything started is torn down.
func Start(ctx context.Context, opts Options) (*Bed, error) {
	if !InNetns() {
		return nil, ErrNotInNetns
	}
	b, err := newBed(opts)
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		if cerr := b.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
		return nil, err
	}
	return b, nil
}

func newBed(opts Options) (*Bed, error) {
	b := &Bed{opts: opts, log: opts.Log, started: time.Now()}
	if b.log == nil {
		b.log = io.Discard
	}
	if opts.APIServers == 0 {
		opts.APIServers = 3
	}
	if opts.APIServers < 1 || opts.APIServers > MaxAPIServers {
		return nil, fmt.Errorf("testbed: APIServers %d: want 1 to %d", opts.APIServers, MaxAPIServers)
	}
	if opts.Version == "" {
		opts.Version = DefaultVersion
	}
	switch {
	case opts.ShutdownDelay == 0:
		b.shutdownDelay = 2 * time.Second
	case opts.ShutdownDelay > 0:
		b.shutdownDelay = opts.ShutdownDelay
	}
	b.readyTimeout = opts.ReadyTimeout
	if b.readyTimeout <= 0 {
		b.readyTimeout = 60 * time.Second
	}
	b.localProxyAddr = opts.LocalProxyAddr
	if b.localProxyAddr == "" {
		b.localProxyAddr = "127.0.0.1:7445"
	}
	b.dir = opts.Dir
	if b.dir == "" {
		d, err := os.MkdirTemp("", "apifailover-testbed-")
		if err != nil {
			return nil, err
		}
		b.dir, b.removeDir = d, true
	} else {
		abs, err := filepath.Abs(b.dir)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, err
		}
		b.dir = abs
	}
	b.opts = opts
	return b, nil
}

func (b *Bed) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "testbed: [%5.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

func (b *Bed) start(ctx context.Context) error {
	var err error
	if b.lock, err = acquireLock(ctx, b.logf); err != nil {
		return err
	}
	if b.tools, b.kube, err = ensureBinaries(ctx, b.opts, b.log); err != nil {
		return err
	}
	b.fw = newFirewall(b.tools.iptables)
	b.addrs = &loAddrs{ip: b.tools.ip}
	if b.exempt = MachineRoot(); b.exempt {
		if err := b.fw.set("exempt", []rule{exemptRule(APIServerPort), relayExemptRule(APIServerPort)}); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	} else {
		b.logf("not real root: apiserver loopback connections are not exempt from network faults")
	}

	if b.pki, err = newPKI(b.dir); err != nil {
		return fmt.Errorf("testbed: certificates: %w", err)
	}
	b.probe = &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: certPool(b.pki.ca), ServerName: OriginName},
			DisableKeepAlives: true,
		},
	}
	b.probeUnverified = &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
			DisableKeepAlives: true,
		},
	}
	if b.ids, err = newIdentities(); err != nil {
		return err
	}
	b.tokenFile = filepath.Join(b.dir, "tokens.csv")
	if err := writeTokenFile(b.tokenFile, b.ids); err != nil {
		return err
	}
	if err := b.writeKubeconfigs(Origin, LocalProxy); err != nil {
		return err
	}
	b.logf("kube-apiserver %s, etcd %s, dir %s", b.kube.apiserver, b.tools.etcd, b.dir)

	if b.etcd, err = startEtcd(ctx, b.tools.etcd, b.dir, b.readyTimeout); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	b.procs.add(b.etcd.proc)
	b.watchEtcd(b.etcd.proc)
	b.logf("etcd ready at %s", b.etcd.clientURL)

	// One after the other: an apiserver's first endpoint reconcile lists
	// the leases present at that moment, and the next round is 10 s away.
	// Started together they race and the last writer often misses a peer,
	// costing a 10 s round; started in turn, the last one lists everybody.
	// Two cores do not start them faster in parallel anyway.
	servers := make([]*APIServer, b.opts.APIServers)
	for i := range servers {
		if servers[i], err = b.newAPIServer(); err != nil {
			return err
		}
		if err := servers[i].start(); err != nil {
			return err
		}
		if err := servers[i].waitReady(ctx); err != nil {
			return err
		}
		b.logf("%s answers /readyz", servers[i].name)
	}

	want := make([]string, len(servers))
	for i, s := range servers {
		want[i] = s.Addr()
	}
	if err := b.WaitEndpoints(ctx, want, b.readyTimeout); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	b.logf("kubernetes EndpointSlice lists %s", strings.Join(want, " "))

	cs, err := servers[0].Clientset()
	if err != nil {
		return err
	}
	if err := applyRBAC(ctx, cs, b.readyTimeout); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	b.logf("control plane up")
	return nil
}

// newAPIServer allocates the next address, puts it on lo, writes its
// kubeconfig and adds the server to the members.
func (b *Bed) newAPIServer() (*APIServer, error) {
	b.mu.Lock()
	if b.next == 0 {
		b.next = 1
	}
	k := b.next
	if k > MaxAPIServers {
		b.mu.Unlock()
		return nil, fmt.Errorf("testbed: at most %d apiservers (certificate SANs)", MaxAPIServers)
	}
	b.next++
	s := &APIServer{bed: b, index: k, name: fmt.Sprintf("apiserver-%d", k), host: apiserverHost(k)}
	b.members = append(b.members, s)
	b.mu.Unlock()

	if err := b.addrs.add(s.host); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	if err := b.writeKubeconfigs(Direct(k)); err != nil {
		return nil, err
	}
	return s, nil
}

// startAndWait starts s and waits for /readyz and for the EndpointSlice
// to list it Ready.
func (b *Bed) startAndWait(ctx context.Context, s *APIServer) error {
	if err := s.start(); err != nil {
		return err
	}
	if err := s.waitReady(ctx); err != nil {
		if dead := b.etcdExited(); dead != nil {
			err = fmt.Errorf("%w (etcd is not running: %w)", err, dead)
		}
		return err
	}
	err := b.waitEndpoints(ctx, b.readyTimeout, fmt.Sprintf("kubernetes EndpointSlice does not list %s", s.Addr()),
		func(got []string) bool { return slices.Contains(got, s.Addr()) })
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	b.logf("%s ready and listed", s.name)
	return nil
}

// AddAPIServer starts one more apiserver on the next address and returns
// once the kubernetes EndpointSlice lists it Ready. On failure the new
// server is killed and not a member; its address is not reused.
func (b *Bed) AddAPIServer(ctx context.Context) (*APIServer, error) {
	s, err := b.newAPIServer()
	if err != nil {
		return nil, err
	}
	if err := b.startAndWait(ctx, s); err != nil {
		kerr := s.Kill()
		b.mu.Lock()
		b.members = slices.DeleteFunc(b.members, func(m *APIServer) bool { return m == s })
		b.mu.Unlock()
		return nil, errors.Join(err, kerr)
	}
	return s, nil
}

// RemoveAPIServer stops s gracefully, waits until its address has left the
// kubernetes EndpointSlice and drops it from APIServers. Removing a
// removed server is a no-op.
func (b *Bed) RemoveAPIServer(ctx context.Context, s *APIServer) error {
	b.mu.Lock()
	i := slices.Index(b.members, s)
	b.mu.Unlock()
	if i < 0 {
		return nil
	}
	if err := s.GracefulStop(ctx); err != nil {
		return err
	}
	if err := errors.Join(s.Restore(), s.Fast()); err != nil {
		return err
	}
	s.closeShims()
	b.mu.Lock()
	b.members = slices.DeleteFunc(b.members, func(m *APIServer) bool { return m == s })
	b.mu.Unlock()
	err := b.waitEndpoints(ctx, b.readyTimeout, fmt.Sprintf("%s still in the kubernetes EndpointSlice", s.Addr()),
		func(got []string) bool { return !slices.Contains(got, s.Addr()) })
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	b.logf("%s removed", s.name)
	return nil
}

// APIServers returns the current members (including killed and stopped
// ones, which can be restarted; not removed ones), in address order.
func (b *Bed) APIServers() []*APIServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.members)
}

// LoopbackExempt reports whether the apiservers' own connections (group
// APIServerGID) escape Blackhole and Reject, as on a real host. True when
// running as real root; in a user namespace (ReexecInNetns as non-root) a
// blackholed apiserver also loses its loopback client and flaps out of the
// EndpointSlice every ~30 s.
func (b *Bed) LoopbackExempt() bool { return b.exempt }

// Dir is the bed's directory.
func (b *Bed) Dir() string { return b.dir }

// CAFile is the PEM file of the CA that signed the apiserver certificate.
func (b *Bed) CAFile() string { return b.pki.ca.certFile }

// CAPEM is the CA certificate, PEM encoded.
func (b *Bed) CAPEM() []byte { return slices.Clone(b.pki.ca.certPEM) }

// OriginName is the name every apiserver certificate is valid for.
func (b *Bed) OriginName() string { return OriginName }

// ServingCertificate is the apiservers' certificate and key (valid for
// OriginName and every apiserver address), for test servers that must pass
// as an apiserver.
func (b *Bed) ServingCertificate() tls.Certificate { return b.pki.serving.tlsCertificate() }

// WrongCertificate is a certificate for WrongName signed by an unrelated
// CA (WrongCAPEM): a poisoned endpoint that fails chain verification.
func (b *Bed) WrongCertificate() tls.Certificate { return b.pki.wrong.tlsCertificate() }

// WrongCAPEM is the unrelated CA that signed WrongCertificate.
func (b *Bed) WrongCAPEM() []byte { return slices.Clone(b.pki.wrongCA.certPEM) }

// MisnamedCertificate is a certificate for WrongName signed by the real CA:
// a poisoned endpoint whose chain verifies but whose name does not.
func (b *Bed) MisnamedCertificate() tls.Certificate { return b.pki.misnamed.tlsCertificate() }

// KubectlPath is the kubectl binary built for the bed's version.
func (b *Bed) KubectlPath() string { return b.kube.kubectl }

// KubeAPIServerPath is the kube-apiserver binary.
func (b *Bed) KubeAPIServerPath() string { return b.kube.apiserver }

// EtcdURL is the etcd client URL.
func (b *Bed) EtcdURL() string { return b.etcd.clientURL }

// Kubectl runs kubectl with the origin kubeconfig (admin) and returns its
// stdout; on failure the error carries stderr.
func (b *Bed) Kubectl(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--kubeconfig=" + b.KubeconfigPath(Origin)}, args...)
	cmd := exec.CommandContext(ctx, b.kube.kubectl, full...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Close kills every process the bed started (hung ones too), waits for
// them, removes the iptables rules and the lo addresses, removes the
// directory if Start created it and lets the next bed start (only one runs
// at a time on a machine: Start waits for the others to close). Safe to
// call more than once.
func (b *Bed) Close() error {
	b.closeOnce.Do(func() {
		b.closing.Store(true)
		var errs []error
		for _, s := range b.APIServers() {
			errs = append(errs, s.Fast())
			s.closeShims()
		}
		errs = append(errs, b.procs.killAll())
		if b.fw != nil {
			errs = append(errs, b.fw.clearAll())
		}
		if b.addrs != nil {
			errs = append(errs, b.addrs.removeAll())
		}
		if b.probe != nil {
			b.probe.CloseIdleConnections()
		}
		if b.removeDir {
			errs = append(errs, os.RemoveAll(b.dir))
		}
		if b.lock != nil {
			errs = append(errs, b.lock.Close())
		}
		b.closeErr = errors.Join(errs...)
		b.logf("closed")
	})
	return b.closeErr
}

// watchEtcd logs etcd's end at once when nobody asked for it, with its
// log's last lines: every apiserver fails from then on, and a scenario
// then only sees apiservers that stopped answering.
func (b *Bed) watchEtcd(p *process) {
	go func() {
		<-p.done
		if !b.closing.Load() {
			b.logf("etcd exited unexpectedly: %v", p.exitedError())
		}
	}()
}

// etcdExited returns why etcd is not running, nil if it runs.
func (b *Bed) etcdExited() error {
	b.mu.Lock()
	p := b.etcd.proc
	b.mu.Unlock()
	if done, _ := p.exited(); done {
		return p.exitedError()
	}
	return nil
}

// reviveEtcd starts etcd again, on its data and addresses, if it exited
// unasked (Heal): the apiservers reconnect by themselves.
func (b *Bed) reviveEtcd(ctx context.Context) error {
	dead := b.etcdExited()
	if dead == nil {
		return nil
	}
	b.logf("restarting etcd, which exited unasked: %v", dead)
	p, err := b.etcd.launch(ctx, b.readyTimeout)
	if err != nil {
		return fmt.Errorf("testbed: restarting etcd: %w", err)
	}
	b.mu.Lock()
	b.etcd.proc, b.etcdPaused = p, false
	b.mu.Unlock()
	b.procs.add(p)
	b.watchEtcd(p)
	b.logf("etcd restarted at %s", b.etcd.clientURL)
	return nil
}
