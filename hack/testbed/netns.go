package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// netnsEnv marks a process (and its children) as running inside the
// private network namespace set up by ReexecInNetns.
const netnsEnv = "APIFAILOVER_TESTBED_NETNS"

// ErrNotInNetns is returned by Start outside the private network namespace:
// the bed adds addresses and iptables rules and must not touch the host's.
var ErrNotInNetns = errors.New("testbed: not inside the private network namespace: call testbed.ReexecInNetns() from TestMain or main")

// InNetns reports whether this process runs inside the namespace set up
// by ReexecInNetns.
func InNetns() bool { return os.Getenv(netnsEnv) == "1" }

// ReexecInNetns makes the rest of the process run inside a private network
// namespace, so the bed's addresses and iptables rules live and die with it.
// Call it first thing from TestMain or main.
//
// Outside the namespace it re-executes this binary with the same arguments
// in a new network namespace (the Go equivalent of
// `unshare --net --fork --kill-child`, plus `--map-root-user` when not
// root), passes stdin, stdout and stderr through, forwards SIGINT, SIGTERM,
// SIGHUP and SIGQUIT, and exits with the child's status: it does not return
// unless the namespace cannot be created. The child is SIGKILLed if this
// process dies.
//
// Inside the namespace (the re-executed child) it brings lo up and returns
// nil. A returned error means no namespace: callers skip or fail.
func ReexecInNetns() error {
	if InNetns() {
		return setupNetns()
	}
	exe, err := os.Executable() // resolved now: /proc/self/exe would name whatever execs it
	if err != nil {
		return fmt.Errorf("testbed: find own executable: %w", err)
	}
	attr := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET,
		Pdeathsig:  syscall.SIGKILL,
	}
	if os.Geteuid() != 0 {
		if err := checkUserns(); err != nil {
			return err
		}
		// Like `unshare --map-root-user`: root inside a user namespace owns
		// the new network namespace, enough for ip and iptables there.
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.SysProcAttr = attr

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		signal.Stop(sigs)
		return fmt.Errorf("testbed: create network namespace (needs root or unprivileged user namespaces): %w", err)
	}
	done := make(chan struct{})
	go forwardSignals(cmd.Process, sigs, done)
	err = cmd.Wait()
	close(done)
	signal.Stop(sigs)
	os.Exit(exitCode(err))
	return nil // not reached
}

// forwardSignals passes signals received by the outer process to the child.
// A terminal's Ctrl-C reaches both (same process group); a second SIGINT is
// harmless for tests and for signal.NotifyContext users.
func forwardSignals(p *os.Process, sigs <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case s := <-sigs:
			_ = p.Signal(s)
		case <-done:
			return
		}
	}
}

// exitCode maps a Wait result to this process's exit status, shell style.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "testbed: waiting for namespaced child: %v\n", err)
	return 1
}

// checkUserns explains why an unprivileged user may not create namespaces.
func checkUserns() error {
	for _, f := range []string{
		"/proc/sys/kernel/unprivileged_userns_clone",             // Debian, Ubuntu
		"/proc/sys/user/max_user_namespaces",                     // all
		"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", // Ubuntu 23.10+ (1 = restricted)
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		restricted := v == "0"
		if strings.HasSuffix(f, "apparmor_restrict_unprivileged_userns") {
			restricted = v == "1"
		}
		if restricted {
			return fmt.Errorf("testbed: not root and unprivileged user namespaces are disabled (%s = %s): run as root", f, v)
		}
	}
	return nil
}

// setupNetns configures the namespace this process runs in.
func setupNetns() error {
	ip, err := findTool("ip")
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	if err := run(ip, "link", "set", "lo", "up"); err != nil {
		return fmt.Errorf("testbed: inside network namespace: %w", err)
	}
	return nil
}

// run executes a short command (ip, iptables) and returns its output in
// the error on failure.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// loAddrs adds and removes the apiserver addresses on lo and remembers
// them so Close can remove them again.
type loAddrs struct {
	ip string

	mu    sync.Mutex // guards added
	added map[string]bool
}

// add puts host/32 on lo; an address already there is fine.
func (a *loAddrs) add(host string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.added[host] {
		return nil
	}
	if err := run(a.ip, "addr", "add", host+"/32", "dev", "lo"); err != nil && !strings.Contains(err.Error(), "File exists") {
		return err
	}
	if a.added == nil {
		a.added = map[string]bool{}
	}
	a.added[host] = true
	return nil
}

// removeAll deletes every address add put on lo.
func (a *loAddrs) removeAll() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for host := range a.added {
		if err := run(a.ip, "addr", "del", host+"/32", "dev", "lo"); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(a.added, host)
	}
	return errors.Join(errs...)
}

// MachineRoot reports whether this process is root in the initial user
// namespace: it may start children under another group or user, and make
// cgroups. Root mapped into a user namespace (ReexecInNetns as non-root)
// has only its own ids.
func MachineRoot() bool {
	if os.Geteuid() != 0 {
		return false
	}
	b, err := os.ReadFile("/proc/self/gid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}
