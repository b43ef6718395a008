//go:build linux

package localproxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

const emfileChildEnv = "LOCALPROXY_TEST_EMFILE_CHILD_UPSTREAM"

// TestRecoversUnderLowFDLimit runs a proxy in a child process whose
// RLIMIT_NOFILE leaves room for a few connections only, sends it many
// more concurrent clients than it has descriptors for, and checks that
// every client is eventually served once earlier ones finish: accept
// backs off on EMFILE instead of spinning or dying.
func TestRecoversUnderLowFDLimit(t *testing.T) {
	echo := newEcho(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEMFILEChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), emfileChildEnv+"="+echo.addr())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	readValue := func(key string) string {
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), key+" "); ok {
				return v
			}
		}
		t.Fatalf("child ended before printing %s: %v", key, lines.Err())
		return ""
	}
	addr := readValue("ADDR")

	const clients = 30
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { errs <- serveOnce(addr, fmt.Sprintf("client %d", i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	stdin.Close() // the child prints its counters and exits
	acceptErrors, err := strconv.ParseFloat(readValue("ACCEPT_ERRORS"), 64)
	require.NoError(t, err)
	assert.Positive(t, acceptErrors, "the child never ran out of descriptors: the test proves nothing")
	require.NoError(t, cmd.Wait())
}

// serveOnce gets one echo round trip through the proxy, reconnecting
// when the proxy had to close the connection (no descriptor for the
// upstream).
func serveOnce(addr, msg string) error {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			last = err
			continue
		}
		err = roundTrip(c, msg)
		c.Close()
		if err == nil {
			return nil
		}
		last = err
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			return err
		}
	}
	return fmt.Errorf("%s: not served: %w", msg, last)
}

// TestEMFILEChild is the child of TestRecoversUnderLowFDLimit.
func TestEMFILEChild(t *testing.T) {
	up := os.Getenv(emfileChildEnv)
	if up == "" {
		t.Skip("child process of TestRecoversUnderLowFDLimit")
	}
	reg := prometheus.NewRegistry()
	r := start(t, localproxy.Config{Endpoints: []string{up}, Registry: reg, DialTimeout: 30 * time.Second})
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	// Room for about three proxied connections (two descriptors each).
	lim.Cur = uint64(len(fds) + 6)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	fmt.Printf("ADDR %s\n", r.addr())
	io.Copy(io.Discard, os.Stdin)
	fmt.Printf("ACCEPT_ERRORS %v\n", metric(t, reg, "apifailover_localproxy_accept_errors_total"))
}
