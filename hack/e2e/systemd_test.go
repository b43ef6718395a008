package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// The shipped units, as an operator installs them (README: systemd).
const (
	sdService = "apifailover-localproxy.service"
	sdSocket  = "apifailover-localproxy.socket"
	// sdWatchdog is the test's WatchdogSec (a drop-in), so that the
	// watchdog's restart comes sooner than the unit's 30s; with pings
	// every 5s, a busy machine does not miss it.
	sdWatchdog = 10 * time.Second
)

// systemdNS is a real systemd, PID 1 of its own PID and mount namespaces
// and sharing the test's network namespace (the bed's API servers, and
// 127.0.0.1:7445 as kubelet would see it). It sees no unit of this
// machine: its unit directories are empty but for the shipped units,
// the targets they order against, and journald; the directories it or
// the service write to are its own (tmpfs), so that nothing it runs (a
// tmpfiles clean-up of /tmp, say) reaches the machine. It runs as in a
// container (container=, /proc/sys and /sys read-only: no kernel setting
// or module of the machine's is touched), in a cgroup namespace rooted at
// a cgroup of its own under the test's, with cgroup file systems and the
// tmpfs that holds them of its own; the test removes its cgroups.
type systemdNS struct {
	t       *testing.T
	unshare *exec.Cmd
	pid     int // systemd's, as this test sees it
	dir     string
	cgroups []string // its cgroup in each hierarchy
}

// sdCgroupPrefix begins the name of the namespace's cgroups.
const sdCgroupPrefix = "apifailover-e2e-systemd-"

// sdSupportUnits are the units of this machine the namespace's systemd
// gets besides the shipped ones: journald, which keeps the service's
// log.
var sdSupportUnits = []string{"systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket"}

// sdTargets are the targets the shipped units order against (their
// default dependencies, network-online.target), empty.
var sdTargets = []string{"apifailover-e2e.target", "sysinit.target", "basic.target", "sockets.target", "shutdown.target", "network-online.target", "multi-user.target"}

// sdEnter runs as the test's child: it joins the cgroups made for the
// namespace (arguments: their cgroup.procs files), then starts the
// namespaces, a cgroup one among them, whose root is where it joined.
const sdEnter = `set -euo pipefail
d=$1; shift
for procs in "$@"; do echo $$ > "$procs"; done
exec unshare --cgroup --pid --fork --kill-child --mount --mount-proc --uts --ipc --propagation private bash "$d"/boot.sh "$d"
`

// sdBoot is PID 1's script until it execs systemd: a container's view of
// the machine (its own cgroup file systems, rooted at its cgroup, on a
// tmpfs of its own; /proc/sys and /sys read-only; /dev/console and
// /dev/kmsg going nowhere), private mounts over every directory systemd
// or the service could change, the units, the binary, its settings and
// the cluster's CA where the README puts them.
const sdBoot = `set -euo pipefail
d=$1
mount --make-rprivate /
mount --rbind /sys /sys
mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup
while read -r type dir opts; do
	mkdir -p "$dir"
	mount -t "$type" -o "$opts" "$type" "$dir"
done < "$d"/cgroups
# Read-only, but for the cgroups: the top of /sys, and what is mounted
# under it (tracing, debugfs and the like).
awk '$5 ~ "^/sys(/|$)" && $5 !~ "^/sys/fs/cgroup(/|$)" { print $5 }' /proc/self/mountinfo | sort -u | while read -r m; do
	mount -o remount,bind,ro "$m"
done
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount --bind /dev/null /dev/console
mount --bind /dev/null /dev/kmsg
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/system /run/apifailover-e2e
cp -r "$d"/units/. /run/systemd/system/
install -m 0644 "$d"/ca.crt /run/apifailover-e2e/ca.crt
install -m 0755 "$d"/localproxy /run/apifailover-e2e/localproxy
install -m 0644 "$d"/env /run/apifailover-e2e/env
# $d is under /tmp: hidden from here on.
for m in /tmp /var/tmp /var/lib /var/log /var/cache /etc/systemd/system /usr/lib/systemd/system \
	/usr/lib/systemd/system-generators /etc/systemd/system-generators /usr/local/bin /etc/default; do
	[ -d "$m" ] || continue
	mount -t tmpfs -o mode=0755 tmpfs "$m"
done
mv /run/apifailover-e2e/localproxy /usr/local/bin/localproxy
mv /run/apifailover-e2e/env /etc/default/apifailover-localproxy
export container=apifailover-e2e
exec /usr/lib/systemd/systemd --system --unit=apifailover-e2e.target --log-target=journal
`

// cgroupHierarchy is a cgroup file system of the machine's, as this
// process sees it.
type cgroupHierarchy struct {
	typ  string // cgroup or cgroup2
	dir  string // where it is mounted
	opts string // the options that mount it again (cgroup v1: its controllers)
	own  string // this process's cgroup in it, a directory under dir
}

// cgroupHierarchies lists the machine's cgroup file systems under
// /sys/fs/cgroup and this process's cgroup in each.
func cgroupHierarchies() ([]cgroupHierarchy, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	paths := map[string]string{} // controllers (sorted, comma-separated; "" for cgroup2) -> path
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			c := strings.Split(f[1], ",")
			slices.Sort(c)
			paths[strings.Join(c, ",")] = f[2]
		}
	}
	var hs []cgroupHierarchy
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || !strings.HasPrefix(f[4], "/sys/fs/cgroup") {
			continue
		}
		root, dir := f[3], f[4]
		h := cgroupHierarchy{typ: g[0], dir: dir}
		var key string
		switch g[0] {
		case "cgroup2":
			h.opts = "rw"
		case "cgroup":
			var c []string
			for _, o := range strings.Split(g[2], ",") {
				if o != "rw" && o != "ro" && !strings.HasPrefix(o, "release_agent=") && o != "clone_children" && o != "xattr" {
					c = append(c, o)
				}
			}
			slices.Sort(c)
			key = strings.Join(c, ",")
			h.opts = key
			if !strings.Contains(key, ",") && strings.HasPrefix(key, "name=") {
				h.opts = "none," + key
			}
		default:
			continue
		}
		p, ok := paths[key]
		if !ok {
			return nil, fmt.Errorf("no line of /proc/self/cgroup for the %s hierarchy at %s", g[0], dir)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || strings.HasPrefix(rel, "..") {
			return nil, fmt.Errorf("this process's cgroup %s is outside the hierarchy's mount at %s (root %s)", p, dir, root)
		}
		h.own = filepath.Join(dir, rel)
		hs = append(hs, h)
	}
	if len(hs) == 0 {
		return nil, errors.New("no cgroup file system under /sys/fs/cgroup")
	}
	return hs, nil
}

// bootSystemd starts systemd with the shipped units in dir (bin the
// localproxy binary, settings for the bed's API servers) and waits until
// it runs.
func bootSystemd(t *testing.T, ctx context.Context, bed *testbed.Bed, dir, bin string) *systemdNS {
	t.Helper()
	// Cgroups and DynamicUser's users need root of the machine; the bed
	// also runs as another user, in a user namespace that maps it to 0.
	if !testbed.MachineRoot() {
		t.Skip("systemd needs the machine's root, not a user namespace's")
	}
	for _, p := range []string{"/usr/lib/systemd/systemd", "/usr/bin/systemctl", "/usr/bin/journalctl"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("systemd is needed (hack/tools/ensure-deps.sh installs it): %v", err)
		}
	}
	units := filepath.Join(dir, "units")
	dropIn := filepath.Join(units, sdService+".d")
	must(t, os.MkdirAll(dropIn, 0o755))
	root, err := testbed.RepoRoot()
	must(t, err)
	for src, dst := range map[string]string{"localproxy.service": sdService, "localproxy.socket": sdSocket} {
		copyFile(t, filepath.Join(root, "cmd", "localproxy", "deploy", src), filepath.Join(units, dst))
	}
	for _, u := range sdSupportUnits {
		copyFile(t, filepath.Join("/usr/lib/systemd/system", u), filepath.Join(units, u))
	}
	for _, u := range sdTargets {
		body := "[Unit]\nDescription=e2e stand-in for " + u + "\n"
		if u == "apifailover-e2e.target" { // what systemd starts at boot
			body += "Wants=systemd-journald.socket systemd-journald-dev-log.socket\n"
		}
		must(t, os.WriteFile(filepath.Join(units, u), []byte(body), 0o644))
	}
	must(t, os.WriteFile(filepath.Join(dropIn, "e2e.conf"), []byte(fmt.Sprintf("[Service]\nWatchdogSec=%v\n", sdWatchdog.Seconds())), 0o644))
	var eps []string
	for _, s := range bed.APIServers() {
		eps = append(eps, s.Addr())
	}
	must(t, os.WriteFile(filepath.Join(dir, "env"), []byte(strings.Join([]string{
		"LOCALPROXY_ENDPOINTS=" + strings.Join(eps, ","),
		"LOCALPROXY_TLS_SERVER_NAME=" + bed.OriginName(),
		"LOCALPROXY_CA_FILE=/run/apifailover-e2e/ca.crt",
		// As handover-socket-activation: a restart's connection attempts
		// wait in the socket's backlog for the old process's drain.
		"LOCALPROXY_SHUTDOWN_TIMEOUT=3s",
		"",
	}, "\n")), 0o644))
	copyFile(t, bed.CAFile(), filepath.Join(dir, "ca.crt"))
	copyFile(t, bin, filepath.Join(dir, "localproxy"))
	must(t, os.WriteFile(filepath.Join(dir, "boot.sh"), []byte(sdBoot), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "enter.sh"), []byte(sdEnter), 0o755))

	// A cgroup of its own under this test's, in every hierarchy: the
	// root of its cgroup namespace, removed at the end.
	s := &systemdNS{t: t, dir: dir}
	hs, err := cgroupHierarchies()
	must(t, err)
	name := fmt.Sprintf("%s%d-%d", sdCgroupPrefix, os.Getpid(), rand.Uint32())
	var procs, mounts []string
	for _, h := range hs {
		sweepCgroups(h.own) // left by a run that could not clean up
		d := filepath.Join(h.own, name)
		must(t, os.Mkdir(d, 0o755))
		s.cgroups = append(s.cgroups, d)
		if strings.Contains(","+h.opts+",", ",cpuset,") { // joined only with CPUs and memory nodes
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h.own, f))
				must(t, err)
				must(t, os.WriteFile(filepath.Join(d, f), b, 0o644))
			}
		}
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
		mounts = append(mounts, fmt.Sprintf("%s %s %s", h.typ, h.dir, h.opts))
	}
	t.Cleanup(func() {
		if err := s.removeCgroups(); err != nil {
			t.Error(err)
		}
	})
	must(t, os.WriteFile(filepath.Join(dir, "cgroups"), []byte(strings.Join(mounts, "\n")+"\n"), 0o644))

	s.unshare = exec.Command("bash", append([]string{filepath.Join(dir, "enter.sh"), dir}, procs...)...)
	outFile, err := os.Create(filepath.Join(dir, "unshare.log"))
	must(t, err)
	defer outFile.Close()
	out := func() string { b, _ := os.ReadFile(outFile.Name()); return string(b) }
	s.unshare.Stdout, s.unshare.Stderr = outFile, outFile
	s.unshare.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(t, s.unshare.Start())
	exited := make(chan struct{})
	go func() { s.unshare.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() && s.pid > 0 {
			j, _ := s.run(context.WithoutCancel(ctx), "journalctl", "--no-pager", "-o", "short-precise", "-n", "300")
			t.Logf("the namespace's journal:\n%s", j)
		}
		// --kill-child: systemd gets SIGKILL as unshare dies, and its
		// PID namespace, the service included, with it.
		s.unshare.Process.Kill()
		<-exited
		if o := out(); o != "" {
			t.Logf("unshare: %s", o)
		}
	})
	e := &env{t: t, ctx: ctx}
	if err := e.waitFor("systemd running in its namespace", observeLimit, func() bool {
		select {
		case <-exited:
			return true // reported below
		default:
		}
		if s.pid == 0 {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", s.unshare.Process.Pid, s.unshare.Process.Pid))
			s.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			if s.pid == 0 {
				return false
			}
		}
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", s.pid)); strings.TrimSpace(string(comm)) != "systemd" {
			return false
		}
		state, _ := s.run(ctx, "systemctl", "is-system-running")
		return state == "running" || state == "degraded"
	}); err != nil {
		t.Fatalf("%v; unshare: %s", err, out())
	}
	select {
	case <-exited:
		t.Fatalf("systemd's namespace ended: %v; unshare: %s", s.unshare.ProcessState, out())
	default:
	}
	return s
}

// removeCgroups removes the namespace's cgroups, and those systemd made
// in them, once their processes are gone.
func (s *systemdNS) removeCgroups() error {
	var last error
	for range 100 { // processes leave their cgroups as they are reaped
		last = nil
		for _, d := range s.cgroups {
			if err := removeCgroupTree(d); err != nil {
				last = err
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// removeCgroupTree removes the cgroup d and those under it, the deepest
// first: rmdir removes only a cgroup without processes or children.
func removeCgroupTree(d string) error {
	var dirs []string
	filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing the cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}

// sweepCgroups removes the namespace cgroups under parent that a run
// killed before its cleanup left; those with processes stay.
func sweepCgroups(parent string) {
	old, _ := filepath.Glob(filepath.Join(parent, sdCgroupPrefix+"*"))
	for _, d := range old {
		removeCgroupTree(d)
	}
}

// run runs a command in the namespace (nsenter), its output trimmed.
func (s *systemdNS) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(s.pid), "-m", "-p", "-u", "-i", "--"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out)), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// systemctl runs systemctl in the namespace; a failure fails the test.
func (s *systemdNS) systemctl(ctx context.Context, args ...string) {
	s.t.Helper()
	if _, err := s.run(ctx, append([]string{"systemctl", "--no-pager"}, args...)...); err != nil {
		s.t.Fatal(err)
	}
}

// show returns unit's properties.
func (s *systemdNS) show(ctx context.Context, unit string, props ...string) map[string]string {
	s.t.Helper()
	out, err := s.run(ctx, "systemctl", "show", unit, "--property="+strings.Join(props, ","))
	if err != nil {
		s.t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// testSystemd runs the shipped systemd units (cmd/localproxy/deploy)
// under a real systemd: the socket unit holds 127.0.0.1:7445, the
// service (DynamicUser, the sandbox, Type=notify) starts and reports
// the API servers in its status; kubectl, fresh TLS connections and a
// client-go workload go through two restarts with nothing refused or
// lost; a proxy that stops (SIGSTOP: it sends no WATCHDOG=1) is
// restarted by systemd's watchdog; a stop is clean.
func testSystemd(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	s := bootSystemd(t, ctx, bed, filepath.Join(dir, "ns"), bin)
	e := &env{t: t, ctx: ctx}

	// Type=notify: start returns once the proxy sent READY=1.
	began := time.Now()
	s.systemctl(ctx, "start", sdSocket, sdService)
	t.Logf("systemctl start returned after %.3fs", time.Since(began).Seconds())
	p := s.show(ctx, sdService, "ActiveState", "SubState", "Type", "MainPID", "WatchdogUSec", "StatusText")
	if p["ActiveState"] != "active" || p["SubState"] != "running" || p["Type"] != "notify" {
		t.Fatalf("after start: %v", p)
	}
	if p["WatchdogUSec"] != sdWatchdog.String() {
		t.Errorf("WatchdogUSec=%s, want %v", p["WatchdogUSec"], sdWatchdog)
	}
	// The sandbox ran it: a dynamic user, not root.
	st, err := s.run(ctx, "cat", "/proc/"+p["MainPID"]+"/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(st, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == "0" {
			t.Errorf("the service runs as root: %s", line)
		}
	}
	// In the namespace's cgroups, under the test's own: the unit's
	// MemoryMax= is set where the machine's accounting of the test sees it.
	for _, d := range s.cgroups {
		if !strings.HasPrefix(d, "/sys/fs/cgroup/memory/") {
			continue
		}
		svc := filepath.Join(d, "system.slice", sdService)
		procs, err := os.ReadFile(filepath.Join(svc, "cgroup.procs"))
		if err != nil || len(strings.Fields(string(procs))) == 0 {
			t.Errorf("the service is not in its memory cgroup %s: %v %q", svc, err, procs)
		}
		if b, err := os.ReadFile(filepath.Join(svc, "memory.limit_in_bytes")); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(256<<20) {
			t.Errorf("%s's memory limit: %q, %v; want MemoryMax=256M", svc, b, err)
		}
	}
	want := fmt.Sprintf("%d of %d API servers healthy", len(bed.APIServers()), len(bed.APIServers()))
	if err := e.waitFor("systemctl status saying "+want, observeLimit, func() bool {
		return strings.HasPrefix(s.show(ctx, sdService, "StatusText")["StatusText"], want)
	}); err != nil {
		t.Fatalf("%v: %v", err, s.show(ctx, sdService, "StatusText"))
	}
	t.Logf("status: %s", s.show(ctx, sdService, "StatusText")["StatusText"])

	// Restarts (an upgrade): the socket stays in systemd.
	load := startHandoverLoad(t, ctx, bed, dir, 7445, "systemd")
	load.waitRuns(t, ctx, 6)
	for i := 1; i <= 2; i++ {
		pid := s.show(ctx, sdService, "MainPID")["MainPID"]
		began := time.Now()
		s.systemctl(ctx, "restart", sdService)
		t.Logf("restart %d: %.3fs (MainPID %s -> %s)", i, time.Since(began).Seconds(), pid, s.show(ctx, sdService, "MainPID")["MainPID"])
		load.waitRuns(t, ctx, 6)
	}
	load.stop(ctx)
	if _, err := s.run(ctx, "test", "-s", "/var/lib/apifailover/state.json"); err != nil {
		t.Errorf("no state file in the StateDirectory: %v", err)
	}

	// A proxy that stops answering: no WATCHDOG=1, and systemd restarts
	// it after WatchdogSec.
	p = s.show(ctx, sdService, "MainPID", "NRestarts")
	stopped := time.Now()
	s.systemctl(ctx, "kill", "--signal=SIGSTOP", sdService)
	if err := e.waitFor("systemd's watchdog restarting the stopped proxy", observeLimit, func() bool {
		q := s.show(ctx, sdService, "MainPID", "NRestarts", "ActiveState")
		return q["ActiveState"] == "active" && q["MainPID"] != p["MainPID"] && q["MainPID"] != "0" && q["NRestarts"] != p["NRestarts"]
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted by the watchdog %.3fs after SIGSTOP (WatchdogSec=%v)", time.Since(stopped).Seconds(), sdWatchdog)
	// systemd's word for it, and the stacks of the stopped proxy's
	// goroutines (SIGABRT), which tell an operator where it hung.
	var j string
	if err := e.waitFor("the watchdog timeout and a goroutine dump in the journal", observeLimit, func() bool {
		j, _ = s.run(ctx, "journalctl", "--no-pager", "-u", sdService)
		return strings.Contains(j, "Watchdog timeout") && strings.Contains(j, "SIGABRT: abort") && strings.Count(j, "goroutine ") >= 5
	}); err != nil {
		t.Errorf("%v:\n%s", err, j)
	}
	kubeconfig := filepath.Join(dir, "systemd.kubeconfig") // written by startHandoverLoad
	if err := e.waitFor("kubectl through the restarted proxy", observeLimit, func() bool {
		out, err := kubectlAt(ctx, bed, kubeconfig, "get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok"
	}); err != nil {
		t.Fatal(err)
	}

	// A stop is clean: SIGTERM, a drain, exit 0.
	s.systemctl(ctx, "stop", sdService, sdSocket)
	if q := s.show(ctx, sdService, "ActiveState", "Result", "ExecMainStatus"); q["ActiveState"] != "inactive" || q["Result"] != "success" || q["ExecMainStatus"] != "0" {
		t.Errorf("after stop: %v", q)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	must(t, err)
	must(t, os.WriteFile(dst, b, 0o644))
}
