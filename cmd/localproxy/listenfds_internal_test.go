package main

import (
	"errors"
	"net"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseListenFDs(t *testing.T) {
	const pid = 4242
	tests := []struct {
		name string
		env  map[string]string
		want passedFDs
		err  []string // the message names these
	}{
		{"none", nil, passedFDs{}, nil},
		{"for this process", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2"}, passedFDs{n: 2}, nil},
		{"with names", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "v4:v6"}, passedFDs{n: 2, names: []string{"v4", "v6"}}, nil},
		{"other process: ignored as systemd does", map[string]string{"LISTEN_PID": "1", "LISTEN_FDS": "2"}, passedFDs{}, nil},
		{"other process, bad count: still ignored", map[string]string{"LISTEN_PID": "1", "LISTEN_FDS": "x"}, passedFDs{}, nil},
		{"FDS without PID: ignored", map[string]string{"LISTEN_FDS": "1"}, passedFDs{}, nil},
		{"PID not a number", map[string]string{"LISTEN_PID": "me", "LISTEN_FDS": "1"}, passedFDs{}, []string{"LISTEN_PID", `"me"`, "positive whole number"}},
		{"PID negative", map[string]string{"LISTEN_PID": "-4242", "LISTEN_FDS": "1"}, passedFDs{}, []string{"LISTEN_PID", `"-4242"`}},
		{"FDS missing", map[string]string{"LISTEN_PID": "4242"}, passedFDs{}, []string{"LISTEN_FDS", `""`, "1 to 64"}},
		{"FDS zero", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "0"}, passedFDs{}, []string{"LISTEN_FDS", `"0"`, "1 to 64"}},
		{"FDS not a number", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "two"}, passedFDs{}, []string{"LISTEN_FDS", `"two"`, "file descriptor 3"}},
		{"FDS too many", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "65"}, passedFDs{}, []string{"LISTEN_FDS", `"65"`}},
		{"names count", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "one"}, passedFDs{}, []string{"LISTEN_FDNAMES", `"one"`, "1 names", "LISTEN_FDS=2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseListenFDs(func(k string) string { return tt.env[k] }, pid)
			if tt.err != nil {
				require.Error(t, err)
				for _, w := range tt.err {
					assert.Contains(t, err.Error(), w)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// listenerFiles returns files of listening sockets as systemd would pass
// them, and a file func serving them by descriptor number from 3 on.
func listenerFiles(t *testing.T, n int) ([]string, func(int, string) (*os.File, error)) {
	var addrs []string
	var files []*os.File
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		f, err := ln.(*net.TCPListener).File()
		require.NoError(t, err)
		ln.Close()
		addrs = append(addrs, ln.Addr().String())
		files = append(files, f)
	}
	t.Cleanup(func() {
		for _, f := range files {
			f.Close()
		}
	})
	return addrs, func(fd int, _ string) (*os.File, error) { return files[fd-listenFDsStart], nil }
}

func TestInheritedListeners(t *testing.T) {
	t.Run("matched by address, in any order", func(t *testing.T) {
		addrs, file := listenerFiles(t, 2)
		byAddr, err := inheritedListeners(passedFDs{n: 2}, []string{addrs[1], addrs[0]}, file)
		require.NoError(t, err)
		listen := listenInherited(byAddr)
		for _, a := range addrs {
			ln, err := listen(t.Context(), "tcp", a)
			require.NoError(t, err)
			assert.Equal(t, a, ln.Addr().String())
			c, err := net.Dial("tcp", a)
			require.NoError(t, err, "the passed socket listens")
			c.Close()
			ln.Close()
		}
		_, err = listen(t.Context(), "tcp", addrs[0])
		assert.ErrorContains(t, err, "LISTEN_FDS", "each socket is handed out once")
	})
	t.Run("fewer sockets than addresses", func(t *testing.T) {
		addrs, file := listenerFiles(t, 1)
		_, err := inheritedListeners(passedFDs{n: 1}, []string{addrs[0], "[::1]:7445"}, file)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "invalid LISTEN_FDS=1: 1 sockets passed")
		assert.Contains(t, err.Error(), addrs[0]+", [::1]:7445")
	})
	t.Run("socket on another address", func(t *testing.T) {
		addrs, file := listenerFiles(t, 2)
		_, err := inheritedListeners(passedFDs{n: 2, names: []string{"a", "b"}}, []string{addrs[0], "127.0.0.1:7445"}, file)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "file descriptor 4 (b) is bound to "+addrs[1])
		assert.Contains(t, err.Error(), "ListenStream=")
		// The matched one was closed too: nothing leaks.
		_, err = net.Dial("tcp", addrs[0])
		assert.Error(t, err)
	})
	t.Run("not a socket", func(t *testing.T) {
		f, err := os.Open(os.DevNull)
		require.NoError(t, err)
		_, err = inheritedListeners(passedFDs{n: 1}, []string{"127.0.0.1:7445"}, func(int, string) (*os.File, error) { return f, nil })
		require.Error(t, err)
		assert.Contains(t, err.Error(), "file descriptor 3 (LISTEN_FD_3) is not a listening socket")
	})
	// A .socket unit with Accept=yes passes each accepted connection;
	// net.FileListener takes it, and every accept would fail.
	t.Run("connected socket", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		a, err := ln.Accept()
		require.NoError(t, err)
		defer a.Close()
		f, err := a.(*net.TCPConn).File()
		require.NoError(t, err)
		_, err = inheritedListeners(passedFDs{n: 1, names: []string{"conn"}}, []string{a.LocalAddr().String()}, func(int, string) (*os.File, error) { return f, nil })
		require.Error(t, err)
		assert.Contains(t, err.Error(), "invalid LISTEN_FDS=1: file descriptor 3 (conn) is a connected socket, not a listening one (a .socket unit with Accept=yes")
		assert.Contains(t, err.Error(), "want one listening TCP socket per listen address ("+a.LocalAddr().String()+")")
		assert.Contains(t, err.Error(), "Accept=no")
	})
	t.Run("descriptor not passed", func(t *testing.T) {
		addrs, file := listenerFiles(t, 1)
		_, err := inheritedListeners(passedFDs{n: 2}, addrs, func(fd int, name string) (*os.File, error) {
			if fd == listenFDsStart {
				return file(fd, name)
			}
			return nil, errors.New("is not open (LISTEN_FDS counts more descriptors than were passed)")
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "invalid LISTEN_FDS=2: file descriptor 4 (LISTEN_FD_4) is not open (LISTEN_FDS counts more descriptors than were passed)")
		_, err = net.Dial("tcp", addrs[0])
		assert.Error(t, err, "the passed socket is closed too")
	})
}

// A descriptor LISTEN_FDS counts that systemd did not pass is not taken:
// an *os.File of it would close a descriptor this process opened itself.
func TestPassedFile(t *testing.T) {
	isOpen := func(fd int) bool {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		return err == nil
	}
	t.Run("not a socket, left open", func(t *testing.T) {
		dn, err := os.Open(os.DevNull)
		require.NoError(t, err)
		defer dn.Close()
		fd := int(dn.Fd())
		_, err = inheritedListeners(passedFDs{n: 1}, []string{"127.0.0.1:7445"}, func(_ int, name string) (*os.File, error) { return passedFile(fd, name) })
		require.Error(t, err)
		assert.Contains(t, err.Error(), "invalid LISTEN_FDS=1: file descriptor 3 (LISTEN_FD_3) is not a socket, and is left open (LISTEN_FDS counts more descriptors than were passed")
		runtime.GC() // an *os.File dropped would be closed by its cleanup
		assert.True(t, isOpen(fd), "a descriptor that is no socket is left open")
	})
	t.Run("not open", func(t *testing.T) {
		const fd = 1 << 20 // above any RLIMIT_NOFILE the tests run with
		require.False(t, isOpen(fd))
		_, err := passedFile(fd, "x")
		assert.EqualError(t, err, "is not open (LISTEN_FDS counts more descriptors than were passed)")
	})
	t.Run("listening socket", func(t *testing.T) {
		addrs, file := listenerFiles(t, 1)
		lf, _ := file(listenFDsStart, "")
		// passedFile's file owns the descriptor: give it a copy.
		fd, err := unix.Dup(int(lf.Fd()))
		require.NoError(t, err)
		byAddr, err := inheritedListeners(passedFDs{n: 1}, addrs, func(_ int, name string) (*os.File, error) { return passedFile(fd, name) })
		require.NoError(t, err)
		c, err := net.Dial("tcp", addrs[0])
		require.NoError(t, err, "the passed socket listens")
		c.Close()
		byAddr[addrs[0]].Close()
	})
}
