package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/apifailover/apifailover/hack/testbed"
)

// localproxyBinary is where prepare builds cmd/localproxy.
func localproxyBinary(root string) string {
	return filepath.Join(root, "_output", "bench", "bin", "localproxy")
}

// prepare runs before the process enters the network namespace, while
// the network is there: it installs the peers and the bed's prerequisites
// (hack/tools/ensure-deps.sh --bench, as root), builds kube-apiserver when
// it is not cached (hack/tools/build-kube.sh) and builds the localproxy
// binary.
func prepare(say func(string, ...any)) error {
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	say("installing the peers and the test bed's packages: hack/tools/ensure-deps.sh --bench")
	if err := runCmd(root, "bash", "hack/tools/ensure-deps.sh", "--bench"); err != nil {
		return fmt.Errorf("ensure-deps.sh --bench (needs root to install haproxy and nginx): %w", err)
	}
	if err := testbed.CheckPrerequisites(testbed.Options{}); err != nil {
		say("building kube-apiserver and kubectl %s (the first time takes minutes): hack/tools/build-kube.sh", testbed.DefaultVersion)
		if err := runCmd(root, "bash", "hack/tools/build-kube.sh", testbed.DefaultVersion); err != nil {
			return fmt.Errorf("build-kube.sh: %w", err)
		}
	}
	bin := localproxyBinary(root)
	say("building the localproxy binary into %s", bin)
	if err := runCmd(root, "go", "build", "-o", bin, "./cmd/localproxy"); err != nil {
		return fmt.Errorf("go build ./cmd/localproxy: %w", err)
	}
	return nil
}

func runCmd(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// run is the benchmark inside the network namespace.
func run(ctx context.Context, o options, say func(string, ...any), stdout io.Writer) error {
	began := time.Now()
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = filepath.Join(root, "_output", "bench")
	}
	scratch := filepath.Join(out, "run")
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	// client-go's warnings (watches ending when a server dies) go to a
	// file, not between the progress lines.
	klogFile, err := os.Create(filepath.Join(scratch, "client-go.log"))
	if err != nil {
		return err
	}
	defer klogFile.Close()
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	_ = kfs.Set("logtostderr", "false")
	_ = kfs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(klogFile)
	bin := localproxyBinary(root)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("localproxy binary: %w (prepare builds it before entering the namespace)", err)
	}
	paths := splitList(o.paths)

	say("starting etcd and 3 kube-apiservers %s", testbed.DefaultVersion)
	bed, err := testbed.Start(ctx, testbed.Options{APIServers: 3, Log: &prefixWriter{w: stdout, prefix: "        "}})
	if err != nil {
		return err
	}
	defer bed.Close()
	e := &env{bed: bed, dir: scratch, localproxyBin: bin}

	res := &Results{
		Date:     time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Machine:  machine(),
		Versions: versions(bin),
		Paths:    make(map[string]string),
		Ops:      opDescriptions,
	}
	for _, p := range paths {
		res.Paths[p] = pathDescriptions[p]
	}
	if !o.skipOverhead && slices.Contains(paths, pathDirect) {
		res.Paths[pathDirectAgain] = pathDescriptions[pathDirectAgain]
	}
	var failures []string

	if !o.skipOverhead {
		say("overhead: %s", strings.Join(paths, ", "))
		rows, err := overhead(ctx, e, paths, o.overhead, out, say)
		res.Overhead.Config = o.overhead
		res.Overhead.Rows = rows
		failures = append(failures, drawCharts(say, func() ([]string, error) { return drawOverhead(out, rows) })...)
		if err != nil {
			res.Overhead.Error = err.Error()
			failures = append(failures, "overhead: "+err.Error())
			say("overhead: %v", err)
		}
	}

	if !o.skipDatapath && ctx.Err() == nil {
		dp, fails := runDatapath(ctx, e, paths, o.datapath, say)
		res.Datapath = dp
		failures = append(failures, fails...)
	}

	if !o.skipFailover {
		res.Failover.Faults = make(map[string]string)
		for _, name := range splitList(o.faults) {
			f := faultByName(name)
			res.Failover.Faults[f.name] = f.what
			for _, p := range paths {
				if ctx.Err() != nil {
					break
				}
				t := time.Now()
				row, err := runFailover(ctx, e, p, *f, o.window, say)
				if err != nil {
					row.Error = err.Error()
					failures = append(failures, fmt.Sprintf("failover %s/%s: %v", f.name, p, err))
					say("    %s/%s: could not measure: %v", f.name, p, err)
				} else {
					say("    %s/%s: marked down %s, first GET elsewhere %s, blind %.2fs, failed GETs %d/%d, creates %d/%d, relists %d, lost %d, conns @10s %d (%s)",
						f.name, p, fmtSecs(row.MarkedDown), fmtSecs(row.FirstGetElsewhere), row.LongestGetGap,
						row.GetsFailed, row.Gets, row.CreatesFailed, row.Creates, row.Relists, row.EventsLost, row.ConnsToVictim,
						time.Since(t).Round(time.Second))
				}
				res.Failover.Rows = append(res.Failover.Rows, row)
			}
		}
	}

	if !o.skipFailover {
		failures = append(failures, drawCharts(say, func() ([]string, error) { return drawFailover(out, res.Failover.Rows, res.Failover.Faults) })...)
	}

	if !o.skipNewConn && ctx.Err() == nil {
		nc, fails := runNewConn(ctx, e, paths, splitList(o.faults), o.newConn, say)
		res.NewConn = nc
		failures = append(failures, fails...)
	}

	if !o.skipCost && ctx.Err() == nil {
		cost, fails := runCost(ctx, e, o.cost, say)
		res.Cost = cost
		failures = append(failures, fails...)
	}

	res.DurationSeconds = round(time.Since(began).Seconds(), 1)
	md, err := res.write(out)
	if err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	fmt.Fprintf(stdout, "\n%s\n", md)
	say("wrote %s and %s", filepath.Join(out, "results.json"), filepath.Join(out, "results.md"))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(failures) > 0 {
		return fmt.Errorf("could not measure:\n  %s", strings.Join(failures, "\n  "))
	}
	return nil
}

// overhead starts every path side by side and measures the ops through
// each.
func overhead(ctx context.Context, e *env, paths []string, cfg overheadConfig, out string, say func(string, ...any)) ([]OverheadRow, error) {
	cs, err := e.bed.APIServers()[0].Clientset()
	if err != nil {
		return nil, err
	}
	say("  seeding namespace %s: ConfigMap %s and %d ConfigMaps of %d bytes", benchNamespace, smallConfigMap, cfg.ListObjects, cfg.ListBytes)
	if err := seedOverhead(ctx, cs, cfg); err != nil {
		return nil, fmt.Errorf("seeding: %w", err)
	}
	if slices.Contains(paths, pathDirect) {
		i := slices.Index(paths, pathDirect)
		paths = slices.Insert(slices.Clone(paths), i+1, pathDirectAgain)
	}
	var clients []*overheadClient
	defer func() {
		for _, c := range clients {
			c.path.close()
		}
	}()
	for _, name := range paths {
		p, err := startPath(ctx, e, name, filepath.Join(e.dir, "overhead", name))
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		oc, err := newOverheadClient(p)
		if err != nil {
			p.close()
			return nil, err
		}
		clients = append(clients, oc)
	}
	for _, c := range clients {
		if !waitUntil(ctx, settleLimit, c.path.settled) {
			return nil, fmt.Errorf("%s did not count every apiserver healthy within %s", c.path.name, settleLimit)
		}
	}
	measureIdle(ctx, clients, idlePeriod)
	for _, c := range clients {
		if c.path.pids != nil {
			say("  %s at rest: %.1fms CPU per second", c.path.name, c.idleRate*1000)
		}
	}
	rows := measureOverhead(ctx, clients, cfg, say)
	for _, c := range clients {
		if c.path.name == pathLocalProxy {
			profileLocalProxy(ctx, c, cfg, out, say)
		}
	}
	return rows, nil
}

// machine describes where the benchmark ran.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d cores (%s, %s/%s), Linux %s; client, proxies, apiservers and etcd share them, on a shared machine: figures are noisy",
		runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, strings.TrimSpace(string(kernel)))
}

func versions(localproxyBin string) map[string]string {
	v := map[string]string{
		"kube-apiserver": testbed.DefaultVersion,
		"go":             runtime.Version(),
		"haproxy":        firstField(strings.TrimPrefix(peerVersion("haproxy"), "HAProxy version ")),
		"nginx":          strings.TrimPrefix(peerVersion("nginx"), "nginx version: nginx/"),
	}
	if out, err := exec.Command(localproxyBin, "--version").Output(); err == nil {
		v["localproxy"] = strings.TrimPrefix(strings.TrimSpace(string(out)), "localproxy ") + " (" + gitDescribe() + ")"
	}
	if out, err := exec.Command("etcd", "--version").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(line, "etcd Version: "); ok {
				v["etcd"] = s
			}
		}
	}
	return v
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return s
}

// gitDescribe names the commit the localproxy binary was built from.
func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown commit"
	}
	return "commit " + strings.TrimSpace(string(out))
}
