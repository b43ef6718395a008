package upstream

import (
	"fmt"
	"os/exec"
	"runtime"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// The addresses kube-proxy's IPVS mode puts on kube-ipvs0 (every
// ClusterIP, the kubernetes Service's among them) are not local; those of
// other interfaces are. In a network namespace of the test's own, with an
// interface named kube-ipvs0.
func TestHostAddrsLeaveOutKubeIPVS(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("making interfaces needs root")
	}
	done := make(chan struct{})
	var ipvs, other, loopback bool
	var failed error
	go func() {
		defer close(done)
		// The thread enters a network namespace of its own and is never
		// given back (no UnlockOSThread): it ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			failed = fmt.Errorf("unshare: %w", err)
			return
		}
		ns := fmt.Sprintf("/proc/%d/task/%d/ns/net", unix.Getpid(), unix.Gettid())
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			// kube-proxy makes a dummy; the name is what counts, and not
			// every kernel has the dummy driver: a veth pair.
			{"link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "ipvs-peer"},
			{"addr", "add", "10.96.0.1/32", "dev", "kube-ipvs0"},
			{"link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"},
			{"addr", "add", "192.0.2.10/24", "dev", "eth0"},
		} {
			if out, err := exec.Command("nsenter", append([]string{"--net=" + ns, "ip"}, args...)...).CombinedOutput(); err != nil {
				failed = fmt.Errorf("ip %v: %w: %s", args, err, out)
				return
			}
		}
		l := newLocalAddrs(logr.Discard())
		ipvs, other, loopback = l.isLocal("10.96.0.1"), l.isLocal("192.0.2.10"), l.isLocal("127.0.0.1")
	}()
	<-done
	if failed != nil {
		t.Skipf("no network namespace of the test's own: %v", failed)
	}
	if ipvs || !other || !loopback {
		t.Errorf("local: kube-ipvs0's 10.96.0.1 %v (want false), eth0's 192.0.2.10 %v, 127.0.0.1 %v (want true)", ipvs, other, loopback)
	}
}
