package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// DefaultVersion is the Kubernetes version built when Options.Version is empty.
const DefaultVersion = "v1.36.3"

var versionRE = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// sbinDirs are searched after PATH: non-root users often lack them.
var sbinDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// findTool looks name up in PATH, then in the sbin directories.
func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range sbinDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: run hack/tools/ensure-deps.sh as root", name)
}

// hostTools are the OS binaries a bed runs.
type hostTools struct {
	etcd, iptables, ip string
}

// ensureHostTools finds etcd, iptables and ip; when one is missing and
// install is set it runs hack/tools/ensure-deps.sh once and looks again.
func ensureHostTools(ctx context.Context, etcdPath string, install bool, log io.Writer) (hostTools, error) {
	look := func() (hostTools, error) {
		var t hostTools
		var errs []error
		var err error
		if etcdPath != "" {
			t.etcd = etcdPath
			if _, err := os.Stat(etcdPath); err != nil {
				errs = append(errs, fmt.Errorf("etcd not found at %s (%w): run hack/tools/ensure-deps.sh as root", etcdPath, err))
			}
		} else if t.etcd, err = findTool("etcd"); err != nil {
			errs = append(errs, err)
		}
		if t.iptables, err = findTool("iptables"); err != nil {
			errs = append(errs, err)
		}
		if t.ip, err = findTool("ip"); err != nil {
			errs = append(errs, err)
		}
		return t, errors.Join(errs...)
	}
	t, err := look()
	if err == nil || !install {
		return t, err
	}
	script, serr := toolScript("ensure-deps.sh")
	if serr != nil {
		return t, errors.Join(err, serr)
	}
	fmt.Fprintf(log, "testbed: installing prerequisites with %s\n", script)
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = log, log
	if rerr := cmd.Run(); rerr != nil {
		return t, fmt.Errorf("%s: %w (after: %w)", script, rerr, err)
	}
	return look()
}

// kubeBinaries are the Kubernetes binaries a bed runs.
type kubeBinaries struct {
	apiserver, kubectl string
}

// kubeCacheBinDir is where hack/tools/build-kube.sh puts a version's
// binaries: ${XDG_CACHE_HOME:-$HOME/.cache}/apifailover/kube/<version>/bin.
func kubeCacheBinDir(version string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "apifailover", "kube", version, "bin"), nil
}

// ensureKube returns the binaries of version from binDir, or from the
// per-user cache, building them with hack/tools/build-kube.sh when absent
// (minutes on first use; progress goes to log).
func ensureKube(ctx context.Context, version, binDir string, log io.Writer) (kubeBinaries, error) {
	if !versionRE.MatchString(version) {
		return kubeBinaries{}, fmt.Errorf("kubernetes version %q: want vX.Y.Z", version)
	}
	find := func(dir string) (kubeBinaries, bool) {
		k := kubeBinaries{
			apiserver: filepath.Join(dir, "kube-apiserver"),
			kubectl:   filepath.Join(dir, "kubectl"),
		}
		for _, p := range []string{k.apiserver, k.kubectl} {
			if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
				return k, false
			}
		}
		return k, true
	}
	if binDir != "" {
		if k, ok := find(binDir); ok {
			return k, nil
		}
		return kubeBinaries{}, fmt.Errorf("kube-apiserver and kubectl not found in %s: build them with hack/tools/build-kube.sh %s", binDir, version)
	}
	dir, err := kubeCacheBinDir(version)
	if err != nil {
		return kubeBinaries{}, err
	}
	if k, ok := find(dir); ok {
		return k, nil
	}
	script, err := toolScript("build-kube.sh")
	if err != nil {
		return kubeBinaries{}, fmt.Errorf("kube-apiserver %s not built: run hack/tools/build-kube.sh %s: %w", version, version, err)
	}
	fmt.Fprintf(log, "testbed: building kube-apiserver and kubectl %s (first time: several minutes)\n", version)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script, version)
	cmd.Stdout = &out
	cmd.Stderr = log
	if err := cmd.Run(); err != nil {
		return kubeBinaries{}, fmt.Errorf("%s %s: %w", script, version, err)
	}
	if built := lastLine(out.String()); built != "" {
		dir = built
	}
	if k, ok := find(dir); ok {
		return k, nil
	}
	return kubeBinaries{}, fmt.Errorf("%s %s succeeded but no binaries in %s", script, version, dir)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// toolScript locates hack/tools/<name>: next to this source file when the
// source tree is around (go test, go run), else in a hack/tools directory
// above the working directory.
func toolScript(name string) (string, error) {
	var candidates []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		candidates = append(candidates, filepath.Join(filepath.Dir(file), "..", "tools", name))
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			candidates = append(candidates, filepath.Join(dir, "hack", "tools", name))
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return filepath.Clean(c), nil
		}
	}
	return "", fmt.Errorf("hack/tools/%s not found (looked in %s)", name, strings.Join(candidates, ", "))
}

// Prepare installs (opts.InstallDeps: etcd, iptables, iproute2 with
// hack/tools/ensure-deps.sh) and builds (kube-apiserver and kubectl for
// opts.Version) what Start needs. Call it before ReexecInNetns: inside the
// private network namespace neither apt nor the Go module proxy can be
// reached. Progress goes to opts.Log.
func Prepare(ctx context.Context, opts Options) error {
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	_, _, err := ensureBinaries(ctx, opts, log)
	return err
}

// ensureBinaries finds the host tools and the Kubernetes binaries a bed
// runs, installing and building them as opts says (see Prepare).
func ensureBinaries(ctx context.Context, opts Options, log io.Writer) (hostTools, kubeBinaries, error) {
	tools, err := ensureHostTools(ctx, opts.EtcdPath, opts.InstallDeps, log)
	if err != nil {
		return tools, kubeBinaries{}, err
	}
	version := opts.Version
	if version == "" {
		version = DefaultVersion
	}
	kube, err := ensureKube(ctx, version, opts.KubeBinDir, log)
	return tools, kube, err
}

// CheckPrerequisites reports what Start would have to install or build
// for opts (nil: nothing), without installing or building anything. Tests
// use it to skip politely when the environment is not prepared.
func CheckPrerequisites(opts Options) error {
	var errs []error
	if opts.EtcdPath != "" {
		if _, err := os.Stat(opts.EtcdPath); err != nil {
			errs = append(errs, fmt.Errorf("etcd not found at %s: run hack/tools/ensure-deps.sh as root", opts.EtcdPath))
		}
	} else if _, err := findTool("etcd"); err != nil {
		errs = append(errs, err)
	}
	for _, t := range []string{"iptables", "ip"} {
		if _, err := findTool(t); err != nil {
			errs = append(errs, err)
		}
	}
	version := opts.Version
	if version == "" {
		version = DefaultVersion
	}
	dir := opts.KubeBinDir
	if dir == "" {
		var err error
		if dir, err = kubeCacheBinDir(version); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range []string{"kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s %s not built: run hack/tools/build-kube.sh %s", b, version, version))
		}
	}
	return errors.Join(errs...)
}
