//go:build linux

package rawio_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/internal/rawio"
)

// pair returns a wrapped TCP connection and its peer.
func pair(t *testing.T) (wrapped, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	peer = <-accepted
	require.NotNil(t, peer)
	wrapped = rawio.Wrap(c)
	require.NotSame(t, c, wrapped)
	t.Cleanup(func() { wrapped.Close(); peer.Close() })
	return wrapped, peer
}

// Data both ways, more than the socket buffers hold (the writer waits for
// the reader), then the peer's close as io.EOF.
func TestConnCopiesBothWaysAndEnds(t *testing.T) {
	c, peer := pair(t)
	want := make([]byte, 16<<20)
	rand.Read(want)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		got <- b
	}()
	n, err := c.Write(want)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite(), "the wrapper's CloseWrite is the connection's")
	assert.True(t, bytes.Equal(want, <-got), "the peer reads what was written")

	go func() {
		peer.Write(want[:1<<20])
		peer.Close()
	}()
	b, err := io.ReadAll(c)
	require.NoError(t, err, "io.EOF at the end")
	assert.True(t, bytes.Equal(want[:1<<20], b))
	n, err = c.Read(make([]byte, 1))
	assert.Zero(t, n)
	assert.Equal(t, io.EOF, err)
}

// A read past the deadline fails as Go's does: a timeout, "read"; a
// closed connection's read and write fail with net.ErrClosed.
func TestConnErrorsAreGos(t *testing.T) {
	c, _ := pair(t)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err := c.Read(make([]byte, 10))
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "read", oe.Op)
	assert.True(t, oe.Timeout())
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Equal(t, c.RemoteAddr(), oe.Addr)

	require.NoError(t, c.Close())
	_, err = c.Read(make([]byte, 10))
	assert.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write([]byte("x"))
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "write", oe.Op)
	assert.ErrorIs(t, err, net.ErrClosed)
}

// A write to a peer that reset the connection fails with the system
// call's error, as Go's does.
func TestConnWriteAfterReset(t *testing.T) {
	c, peer := pair(t)
	require.NoError(t, peer.(*net.TCPConn).SetLinger(0))
	require.NoError(t, peer.Close())
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write(make([]byte, 64<<10))
		time.Sleep(time.Millisecond)
	}
	var se *os.SyscallError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "write", se.Syscall)
	assert.NotErrorIs(t, err, net.ErrClosed, "the peer's reset, not a close of ours")
}

// Not TCP: returned as it is.
func TestWrapLeavesOthersAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Same(t, a, rawio.Wrap(a))
}
