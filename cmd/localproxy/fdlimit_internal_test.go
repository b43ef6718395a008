package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/localproxy"
)

func TestFileLimitError(t *testing.T) {
	assert.NoError(t, fileLimitError(10000, 65536), "the systemd unit's limit fits the default")
	assert.NoError(t, fileLimitError(10000, unix.RLIM_INFINITY))
	err := fileLimitError(10000, 1024)
	require.Error(t, err)
	for _, want := range []string{"--max-connections=10000", "30128 file descriptors", "RLIMIT_NOFILE) is 1024", "LimitNOFILE=", "at most 298"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NoError(t, fileLimitError(298, 1024), "the suggested maximum fits")
	assert.Error(t, fileLimitError(299, 1024))
	assert.Equal(t, 298, maxConnsFor(1024))
	assert.Zero(t, maxConnsFor(100))
}

// The default --max-connections is lowered to what the file limit holds;
// the proxy starts.
func TestRunLowersDefaultMaxConnectionsToFileLimit(t *testing.T) {
	limit := fileLimit()
	if maxConnsFor(limit) >= localproxy.DefaultMaxConnections {
		t.Skipf("RLIMIT_NOFILE %d holds the default", limit)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-port=" + strconv.Itoa(freePort(t)),
			"--health-port=" + strconv.Itoa(freePort(t)), "--log-format=json"}, func(string) string { return "" }, &strings.Builder{}, &logs)
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"proxy listening"`) }, 10*time.Second, 10*time.Millisecond, "%s", logs.String())
	assert.Contains(t, logs.String(), fmt.Sprintf(`"maxConnections":%d`, maxConnsFor(limit)))
	cancel()
	assert.Equal(t, exitOK, <-done)
}

// A --max-connections beyond the process's file limit is refused at
// start, with exit code 2, before anything listens.
func TestRunRefusesMaxConnectionsBeyondFileLimit(t *testing.T) {
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &rl))
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur > 1<<40 {
		t.Skipf("no file limit to exceed (RLIMIT_NOFILE %d)", rl.Cur)
	}
	var stderr strings.Builder
	code := run(t.Context(), []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-port=1", "--health-port=2",
		"--max-connections=" + strconv.FormatUint(rl.Cur, 10)}, func(string) string { return "" }, &strings.Builder{}, &stderr)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr.String(), "RLIMIT_NOFILE")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
