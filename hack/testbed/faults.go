package testbed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
)

// gracefulStopLimit bounds GracefulStop beyond --shutdown-delay-duration.
const gracefulStopLimit = 60 * time.Second

// Kill SIGKILLs the apiserver and waits until it is gone. Its address stays
// in the kubernetes EndpointSlice until its lease expires and a peer
// reconciles: 5 to 25 s (measured 14-20 s). No-op when not running.
func (s *APIServer) Kill() error {
	proc := s.current()
	if proc == nil {
		return nil
	}
	err := proc.kill()
	s.mu.Lock()
	s.hung = false
	s.mu.Unlock()
	return err
}

// Hang SIGSTOPs the apiserver: connections are accepted by the kernel
// (backlog) but nothing answers, so requests time out. It stops renewing
// its lease, so after 5 to 25 s (measured ~20 s) it leaves the
// EndpointSlice; after Resume it lists itself again at once. Undo with
// Resume.
func (s *APIServer) Hang() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() || s.hung {
		return nil
	}
	if err := s.proc.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	s.hung = true
	return nil
}

// Resume SIGCONTs a hung apiserver. No-op when not hung.
func (s *APIServer) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() || !s.hung {
		s.hung = false
		return nil
	}
	if err := s.proc.signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.hung = false
	return nil
}

// Hung reports whether the apiserver is SIGSTOPped.
func (s *APIServer) Hung() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung && s.runningLocked()
}

// Blackhole drops every packet to and from this apiserver's address and
// port (iptables DROP in INPUT and OUTPUT, both directions): new
// connections and established ones time out. The apiserver's own
// connections are spared (see LoopbackExempt), so it keeps its lease and
// stays listed Ready in the EndpointSlice, like a server cut off from its
// clients but not from etcd. Replaces a Reject. Undo with Restore.
func (s *APIServer) Blackhole() error {
	if err := s.bed.fw.set(s.host, blackholeRules(s.host, APIServerPort)); err != nil {
		return fmt.Errorf("%s: blackhole: %w", s.name, err)
	}
	return nil
}

// Reject answers every packet to and from this apiserver's address and
// port with a TCP reset (iptables REJECT --reject-with tcp-reset): new
// connections are refused, established ones reset. Replaces a Blackhole.
// Undo with Restore.
func (s *APIServer) Reject() error {
	if err := s.bed.fw.set(s.host, rejectRules(s.host, APIServerPort)); err != nil {
		return fmt.Errorf("%s: reject: %w", s.name, err)
	}
	return nil
}

// Lossy drops packets to and from this apiserver's address and port at
// random, each with probability p (0 < p < 1; iptables statistic match),
// in both directions: TCP retransmits, so connections stay up but stall
// now and then for a retransmission timeout (200 ms and more). The
// apiserver's own connections are spared (see Blackhole). Replaces a
// Blackhole or Reject. Undo with Restore.
func (s *APIServer) Lossy(p float64) error {
	if !(p > 0 && p < 1) {
		return fmt.Errorf("%s: lossy: probability %v: want 0 < p < 1", s.name, p)
	}
	if err := s.bed.fw.set(s.host, lossyRules(s.host, APIServerPort, p)); err != nil {
		return fmt.Errorf("%s: lossy: %w", s.name, err)
	}
	return nil
}

// Restore removes a Blackhole, Reject or Lossy. No-op when there is none.
func (s *APIServer) Restore() error {
	if err := s.bed.fw.set(s.host, nil); err != nil {
		return fmt.Errorf("%s: restore: %w", s.name, err)
	}
	return nil
}

// NetworkFault reports the active network fault: "blackhole", "reject",
// "lossy" or "".
func (s *APIServer) NetworkFault() string {
	rules := s.bed.fw.active(s.host)
	switch {
	case len(rules) == 0:
		return ""
	case slices.Contains(rules[0].spec, "statistic"):
		return "lossy"
	case slices.Contains(rules[0].spec, "DROP"):
		return "blackhole"
	}
	return "reject"
}

// Terminate sends SIGTERM (resuming a hung server first) and returns at
// once: the apiserver removes its address from the kubernetes
// EndpointSlice, fails /readyz for the shutdown delay while still serving,
// then exits. Wait for the exit with Wait.
//
// SIGTERM is sent once per process: kube-apiserver exits at once (status
// 1, no shutdown delay) on a second signal.
func (s *APIServer) Terminate() error {
	if err := s.Resume(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.terminated {
		return nil
	}
	if err := s.proc.signal(syscall.SIGTERM); err != nil {
		return err
	}
	s.proc.terminated = true
	return nil
}

// Wait blocks until the apiserver process has exited or ctx ends.
func (s *APIServer) Wait(ctx context.Context) error {
	proc := s.current()
	if proc == nil {
		return nil
	}
	return proc.wait(ctx)
}

// GracefulStop terminates the apiserver (see Terminate) and waits for it
// to exit: at most the shutdown delay plus one minute, or until ctx ends.
func (s *APIServer) GracefulStop(ctx context.Context) error {
	if err := s.Terminate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.bed.shutdownDelay+gracefulStopLimit)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		return fmt.Errorf("%s: graceful stop: %w", s.name, err)
	}
	return nil
}

// Restart starts the apiserver again on the same address (stopping it
// gracefully first if it still runs) and waits until /readyz is ok and the
// kubernetes EndpointSlice lists it Ready. Network faults stay in place
// (Restore them first); a blackholed or rejected server never becomes ready.
func (s *APIServer) Restart(ctx context.Context) error {
	if s.Running() {
		if err := s.GracefulStop(ctx); err != nil {
			return err
		}
	}
	return s.bed.startAndWait(ctx, s)
}

// PauseEtcd SIGSTOPs etcd: every apiserver stays up and keeps serving
// watches from its cache, but requests that need etcd (quorum reads,
// writes) wait, and /readyz, which checks etcd, answers late or with 500.
// Undo with ResumeEtcd. Measured on kube-apiserver v1.36.3: see doc.go.
func (b *Bed) PauseEtcd() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.etcdPaused {
		return nil
	}
	if err := b.etcd.proc.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	b.etcdPaused = true
	return nil
}

// ResumeEtcd SIGCONTs a paused etcd. No-op when not paused.
func (b *Bed) ResumeEtcd() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.etcdPaused {
		return nil
	}
	if err := b.etcd.proc.signal(syscall.SIGCONT); err != nil {
		return err
	}
	b.etcdPaused = false
	return nil
}

// Heal undoes every fault (a paused etcd; hung, blackholed, rejecting,
// lossy or slow apiservers; serving certificate faults) and restarts
// stopped apiservers, then waits until each answers /readyz and the
// kubernetes EndpointSlice lists them all: a scenario or benchmark run
// after it starts from a healthy control plane.
func (b *Bed) Heal(ctx context.Context) error {
	if err := b.reviveEtcd(ctx); err != nil {
		return err
	}
	errs := []error{b.ResumeEtcd()}
	for _, s := range b.APIServers() {
		errs = append(errs, s.Resume(), s.Restore(), s.Fast())
	}
	for _, s := range b.APIServers() {
		switch {
		case s.CertFault() != "":
			errs = append(errs, s.RestartGoodCert(ctx))
		case !s.Running():
			errs = append(errs, b.startAgain(ctx, s, s.Restart(ctx)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var want []string
	for _, s := range b.APIServers() {
		want = append(want, s.Addr())
		if err := s.waitReadyWithin(ctx, healReadyWait); err != nil {
			if err := b.startAgain(ctx, s, fmt.Errorf("%s: %w", s.Name(), err)); err != nil {
				return err
			}
		}
	}
	return b.WaitEndpoints(ctx, want, 60*time.Second)
}

// healReadyWait is how long Heal waits for a running apiserver that does
// not answer /readyz with 200 before it starts it again.
const healReadyWait = 10 * time.Second

// startAgain, after err (nil: nothing to do) from a start of s or a wait
// for it to be ready, kills s and starts it once more, if it runs: an
// apiserver started while the machine was starved can stay unready for
// minutes (its start-up hooks timed out), and every later heal would fail
// on it.
func (b *Bed) startAgain(ctx context.Context, s *APIServer, err error) error {
	if err == nil || !s.Running() || ctx.Err() != nil {
		return err
	}
	b.logf("%s runs but is not ready (%v): killing it and starting it again", s.Name(), err)
	if kerr := s.Kill(); kerr != nil {
		return fmt.Errorf("%w; killing it: %w", err, kerr)
	}
	if rerr := s.Restart(ctx); rerr != nil {
		return fmt.Errorf("%w; started again: %w", err, rerr)
	}
	return nil
}
