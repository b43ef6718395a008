package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	main "github.com/apifailover/apifailover/cmd/localproxy"
)

// owner returns the UID and GID of path.
func owner(t *testing.T, path string) (int, int, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid), fi.Mode().Perm()
}

// "localproxy state-dir" gives the state file's directory (a hostPath the
// kubelet created, root's, 0755) to the proxy's user, with the state file
// and its temporary files; again, it changes nothing; a directory that
// holds anything else is not taken over.
func TestStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changes owners: needs root")
	}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := main.Run(t.Context(), append([]string{"state-dir"}, args...), env(), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	root := t.TempDir()
	dir := filepath.Join(root, "localproxy")
	require.NoError(t, os.Mkdir(dir, 0o755))
	state := filepath.Join(dir, "state.json")
	require.NoError(t, os.WriteFile(state, []byte("{}"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".localproxy-state-123"), nil, 0o600))

	code, out, errOut := run("--state-file=" + state)
	require.Equal(t, main.ExitOK, code, errOut)
	assert.Equal(t, "localproxy state-dir: gave "+dir+" to 65534:65534, mode 0750, and .localproxy-state-123, and state.json\n", out)
	for _, p := range []string{dir, state, filepath.Join(dir, ".localproxy-state-123")} {
		uid, gid, _ := owner(t, p)
		assert.Equal(t, []int{65534, 65534}, []int{uid, gid}, p)
	}
	_, _, mode := owner(t, dir)
	assert.Equal(t, os.FileMode(0o750), mode)

	code, out, _ = run("--state-file=" + state)
	assert.Equal(t, main.ExitOK, code)
	assert.Equal(t, "localproxy state-dir: "+dir+" is owned by 65534:65534 already\n", out)

	// A directory that does not exist yet is made.
	code, out, errOut = run("--state-file="+filepath.Join(root, "new", "state.json"), "--owner=1000:1001")
	require.Equal(t, main.ExitOK, code, errOut)
	assert.Equal(t, "localproxy state-dir: gave "+filepath.Join(root, "new")+" to 1000:1001, mode 0750\n", out)

	// Missing parents are made as mkdir -p and the kubelet's
	// DirectoryOrCreate make them, root's and 0755, so that the proxy's
	// user reaches its directory; only that one is 0750 and given away.
	deep := filepath.Join(root, "a", "b", "localproxy")
	code, out, errOut = run("--state-file="+filepath.Join(deep, "state.json"), "--owner=1000:1001")
	require.Equal(t, main.ExitOK, code, errOut)
	assert.Equal(t, "localproxy state-dir: gave "+deep+" to 1000:1001, mode 0750\n", out)
	for _, p := range []string{filepath.Join(root, "a"), filepath.Join(root, "a", "b")} {
		uid, gid, mode := owner(t, p)
		assert.Equal(t, []int{0, 0}, []int{uid, gid}, p)
		assert.Equal(t, os.FileMode(0o755), mode, p)
	}
	uid, gid, mode := owner(t, deep)
	assert.Equal(t, []int{1000, 1001}, []int{uid, gid})
	assert.Equal(t, os.FileMode(0o750), mode)

	// Another directory's files are left alone.
	shared := filepath.Join(root, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(shared, "kubelet.conf"), nil, 0o600))
	code, _, errOut = run("--state-file=" + filepath.Join(shared, "state.json"))
	assert.Equal(t, main.ExitError, code)
	assert.Equal(t, "localproxy state-dir: "+shared+" holds other files than the state file (kubelet.conf), so it is not given to 65534:65534; want a directory of its own for --state-file, e.g. /var/lib/localproxy\n", errOut)
	uid, _, _ = owner(t, shared)
	assert.Equal(t, 0, uid)
}

func TestStateDirBadValues(t *testing.T) {
	// A value accepted by mistake changes a temporary directory, not the
	// system's.
	state := filepath.Join(t.TempDir(), "localproxy", "state.json")
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--state-file=state.json"}, nil, `invalid --state-file="state.json": want an absolute path in a directory of its own, e.g. /var/lib/localproxy/state.json`},
		{[]string{"--state-file=/state.json"}, nil, `invalid --state-file="/state.json": want an absolute path in a directory of its own, e.g. /var/lib/localproxy/state.json`},
		{nil, nil, `invalid --state-file="": want an absolute path in a directory of its own, e.g. /var/lib/localproxy/state.json`},
		{[]string{"--state-file=" + state, "--owner=nobody"}, nil, `invalid --owner="nobody": want UID:GID, two numbers 0-4294967294, e.g. 65534:65534`},
		{nil, []string{"LOCALPROXY_STATE_FILE", "x"}, `invalid LOCALPROXY_STATE_FILE="x" (--state-file): want an absolute path in a directory of its own, e.g. /var/lib/localproxy/state.json`},
		// chown(2) takes 32 bits: 4294967295 is -1, "leave unchanged", and
		// larger IDs would be truncated to another user's.
		{[]string{"--state-file=" + state, "--owner=4294967295:65534"}, nil, `invalid --owner="4294967295:65534": want UID:GID, two numbers 0-4294967294, e.g. 65534:65534`},
		{[]string{"--state-file=" + state, "--owner=65534:4294967296"}, nil, `invalid --owner="65534:4294967296": want UID:GID, two numbers 0-4294967294, e.g. 65534:65534`},
		{[]string{"--state-file=" + state}, []string{"LOCALPROXY_OWNER", "99999999999:1"}, `invalid LOCALPROXY_OWNER="99999999999:1" (--owner): want UID:GID, two numbers 0-4294967294, e.g. 65534:65534`},
	} {
		var stderr bytes.Buffer
		code := main.Run(t.Context(), append([]string{"state-dir"}, tc.args...), env(tc.env...), &bytes.Buffer{}, &stderr)
		assert.Equal(t, main.ExitUsage, code)
		assert.Equal(t, "localproxy state-dir: "+tc.want+"\n", stderr.String())
	}
}
