package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	flag "github.com/spf13/pflag"

	"github.com/apifailover/apifailover/localproxy"
)

const stateDirCmd = "localproxy state-dir"

// runStateDir implements "localproxy state-dir": make the directory of
// --state-file writable by the proxy's user, for a DaemonSet whose state
// file lives on a hostPath (created by the kubelet root-owned, mode 0755)
// and whose proxy runs as UID 65534. It runs as root in an init container
// with CAP_CHOWN only, so it refuses to take over a directory that holds
// anything but the state file: a hostPath of /var/lib by mistake must not
// become the proxy's.
func runStateDir(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var o options
	var owner string
	fs := flag.NewFlagSet(stateDirCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.stateFile, "state-file", "", "the proxy's --state-file (absolute); its directory is created if missing (missing parents 0755, the caller's) and given to --owner, mode 0750")
	fs.StringVar(&owner, "owner", "65534:65534", "UID:GID the proxy runs as, each 0-4294967294")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s --state-file=FILE [--owner=UID:GID]\n\n"+
			"Makes the directory of the state file writable by the proxy's user (run as root, e.g. in an\n"+
			"init container, before the proxy). A directory holding other files than the state file is refused.\n\nFlags:\n", stateDirCmd)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, &o, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		printErrors(stderr, stateDirCmd, err)
		return exitUsage
	}
	printWarnings(stderr, stateDirCmd, o.warnings)
	uid, gid, ok := parseOwner(owner)
	switch {
	case !ok:
		fmt.Fprintf(stderr, "%s: %v\n", stateDirCmd, o.bad("owner", owner, fmt.Sprintf("want UID:GID, two numbers 0-%d, e.g. 65534:65534", maxID)))
		return exitUsage
	case !filepath.IsAbs(o.stateFile) || filepath.Dir(filepath.Clean(o.stateFile)) == "/":
		fmt.Fprintf(stderr, "%s: %v\n", stateDirCmd, o.bad("state-file", o.stateFile, "want an absolute path in a directory of its own, e.g. /var/lib/localproxy/state.json"))
		return exitUsage
	}
	did, err := prepareStateDir(filepath.Clean(o.stateFile), uid, gid)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", stateDirCmd, err)
		return exitError
	}
	fmt.Fprintf(stdout, "%s: %s\n", stateDirCmd, did)
	return exitOK
}

// maxID is the highest UID or GID: chown(2) takes 32 bits, and
// 4294967295, -1, leaves the owner unchanged.
const maxID = 1<<32 - 2

// parseOwner parses UID:GID, each 0 to maxID.
func parseOwner(s string) (uid, gid int, ok bool) {
	u, g, found := strings.Cut(s, ":")
	uid, errU := strconv.Atoi(u)
	gid, errG := strconv.Atoi(g)
	return uid, gid, found && errU == nil && errG == nil && uid >= 0 && gid >= 0 && uid <= maxID && gid <= maxID
}

// mkdirs makes dir, mode 0750, and its missing parents as mkdir -p and
// the kubelet's DirectoryOrCreate do, root's (the caller's) and 0755
// whatever the umask: the proxy's user must reach dir through them.
func mkdirs(dir string) error {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil || !errors.Is(err, os.ErrNotExist) || p == filepath.Dir(p) {
			break
		}
		missing = append(missing, p)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		mode := os.FileMode(0o755)
		if i == 0 {
			mode = 0o750
		}
		if err := os.Mkdir(missing[i], mode); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := os.Chmod(missing[i], mode); err != nil {
			return err
		}
	}
	return nil
}

// prepareStateDir creates the directory of path if missing (its missing
// parents root's, 0755) and gives it, mode 0750, and the state file and its temporary files in it, to
// uid:gid. It says what it did.
func prepareStateDir(path string, uid, gid int) (string, error) {
	dir := filepath.Dir(path)
	if err := mkdirs(dir); err != nil {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return "", fmt.Errorf("%s is not a directory (a symbolic link is not followed)", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var own, others []string
	for _, e := range entries {
		if n := e.Name(); n == filepath.Base(path) || strings.HasPrefix(n, localproxy.StateFileTempPrefix) {
			own = append(own, n)
		} else {
			others = append(others, n)
		}
	}
	did := fmt.Sprintf("%s is owned by %d:%d already", dir, uid, gid)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if len(others) > 0 {
			slices.Sort(others)
			return "", fmt.Errorf("%s holds other files than the state file (%s), so it is not given to %d:%d; want a directory of its own for --state-file, e.g. /var/lib/localproxy",
				dir, strings.Join(others[:min(len(others), 5)], ", "), uid, gid)
		}
		// Mode first: the owner may, and root is the owner until the
		// chown (CAP_FOWNER is not needed).
		if err := os.Chmod(dir, 0o750); err != nil {
			return "", err
		}
		if err := os.Lchown(dir, uid, gid); err != nil {
			return "", err
		}
		did = fmt.Sprintf("gave %s to %d:%d, mode 0750", dir, uid, gid)
	}
	for _, n := range own {
		p := filepath.Join(dir, n)
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != uid || int(st.Gid) != gid) {
			if err := os.Lchown(p, uid, gid); err != nil {
				return "", err
			}
			did += ", and " + n
		}
	}
	return did, nil
}
