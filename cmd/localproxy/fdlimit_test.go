package main_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/localproxy"
)

func TestFileLimitError(t *testing.T) {
	assert.NoError(t, main.FileLimitError(10000, 65536), "the systemd unit's limit fits the default")
	assert.NoError(t, main.FileLimitError(10000, unix.RLIM_INFINITY))
	err := main.FileLimitError(10000, 1024)
	require.Error(t, err)
	for _, want := range []string{"--max-connections=10000", "20304 file descriptors", "RLIMIT_NOFILE) is 1024", "LimitNOFILE=", "at most 360"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NoError(t, main.FileLimitError(360, 1024), "the suggested maximum fits")
	assert.Error(t, main.FileLimitError(361, 1024))
	assert.Equal(t, 360, main.MaxConnsFor(1024))
	assert.Zero(t, main.MaxConnsFor(305), "the splice pipes, the health server's connections and the rest fill the limit")
	assert.Equal(t, 1, main.MaxConnsFor(306))
}

// The default --max-connections is lowered to what the file limit holds;
// the proxy starts.
func TestRunLowersDefaultMaxConnectionsToFileLimit(t *testing.T) {
	limit := main.FileLimit()
	if main.MaxConnsFor(limit) >= localproxy.DefaultMaxConnections {
		t.Skipf("RLIMIT_NOFILE %d holds the default", limit)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- main.Run(ctx, []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-port=" + strconv.Itoa(freePort(t)),
			"--health-port=" + strconv.Itoa(freePort(t)), "--log-format=json"}, env(), &strings.Builder{}, &logs)
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"proxy listening"`) }, 10*time.Second, 10*time.Millisecond, "%s", logs.String())
	assert.Contains(t, logs.String(), fmt.Sprintf(`"maxConnections":%d`, main.MaxConnsFor(limit)))
	cancel()
	assert.Equal(t, main.ExitOK, <-done)
}

// A --max-connections beyond the process's file limit is refused at
// start, with exit code 2, before anything listens.
func TestRunRefusesMaxConnectionsBeyondFileLimit(t *testing.T) {
	limit := main.FileLimit()
	if limit == unix.RLIM_INFINITY || limit > 1<<40 {
		t.Skipf("no file limit to exceed (RLIMIT_NOFILE %d)", limit)
	}
	var stderr strings.Builder
	code := main.Run(t.Context(), []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-port=1", "--health-port=2",
		"--max-connections=" + strconv.FormatUint(limit, 10)}, env(), &strings.Builder{}, &stderr)
	assert.Equal(t, main.ExitUsage, code)
	assert.Contains(t, stderr.String(), "RLIMIT_NOFILE")
}
