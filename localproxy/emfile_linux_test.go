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

const (
	emfileChildEnv = "LOCALPROXY_TEST_EMFILE_CHILD_UPSTREAM"
	// emfileFillEnv set: the child fills its descriptors when told
	// (TestShortageBlamesNoEndpoint).
	emfileFillEnv = "LOCALPROXY_TEST_EMFILE_CHILD_FILL"
)

// TestRecoversUnderLowFDLimit runs a proxy in a child process whose
// RLIMIT_NOFILE leaves room for a few connections only, sends it many
// more concurrent clients than it has descriptors for, and checks that
// every client is eventually served once earlier ones finish: accept
// backs off on EMFILE instead of spinning or dying.
func TestRecoversUnderLowFDLimit(t *testing.T) {
	ch := startEMFILEChild(t)
	addr, readValue := ch.addr, ch.readValue

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
	ch.stdin.Close() // the child prints its counters and exits
	// The child runs out either in accept or in the socket for the
	// upstream, as its descriptors' parity falls.
	acceptErrors, err := strconv.ParseFloat(readValue("ACCEPT_ERRORS"), 64)
	require.NoError(t, err)
	short, err := strconv.ParseFloat(readValue("REJECTED_LOCAL_RESOURCES"), 64)
	require.NoError(t, err)
	assert.Positive(t, acceptErrors+short, "the child never ran out of descriptors: the test proves nothing")
	require.NoError(t, ch.cmd.Wait())
}

// emfileChild is a proxy in a child process (TestEMFILEChild) to an echo
// server of the test's, with a low RLIMIT_NOFILE.
type emfileChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	addr  string // the proxy's
	t     *testing.T
}

// startEMFILEChild starts the child, env added to its environment, and
// waits for its address.
func startEMFILEChild(t *testing.T, env ...string) *emfileChild {
	echo := newEcho(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEMFILEChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), emfileChildEnv+"="+echo.addr()), env...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ch := &emfileChild{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), t: t}
	ch.addr = ch.readValue("ADDR")
	return ch
}

// readValue reads the child's lines up to one that is key, or key, a
// space and a value, and returns the value.
func (ch *emfileChild) readValue(key string) string {
	for ch.lines.Scan() {
		if ch.lines.Text() == key {
			return ""
		}
		if v, ok := strings.CutPrefix(ch.lines.Text(), key+" "); ok {
			return v
		}
	}
	ch.t.Fatalf("child ended before printing %s: %v", key, ch.lines.Err())
	return ""
}

// TestShortageBlamesNoEndpoint leaves a proxy one free descriptor: it
// accepts a client with it and fails to open the upstream's socket. That
// is this host's shortage, not the endpoint's refusal: the client is
// counted as rejected for local_resources, not no_endpoint, starts no
// hold-off (which would close the next clients without a dial and tell
// them every endpoint refused), and once descriptors come free the next
// client is served. On the event loop and on goroutines (GOMAXPROCS=1).
func TestShortageBlamesNoEndpoint(t *testing.T) {
	for _, procs := range []string{"2", "1"} {
		t.Run("gomaxprocs="+procs, func(t *testing.T) {
			ch := startEMFILEChild(t, emfileFillEnv+"=1", "GOMAXPROCS="+procs)
			addr, readValue := ch.addr, ch.readValue
			tell := func(cmd, done string) {
				_, err := io.WriteString(ch.stdin, cmd+"\n")
				require.NoError(t, err)
				readValue(done)
			}

			tell("fill", "FILLED")
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			require.NoError(t, err)
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = c.Read(make([]byte, 1))
			require.Error(t, err, "served with no descriptor for the upstream")
			assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the client was left waiting")
			c.Close()

			tell("free", "FREED")
			require.NoError(t, serveOnce(addr, "after the shortage"))

			ch.stdin.Close()
			// (accept may fail too: accept4 wants a free descriptor
			// before it looks at the queue, and the accept loop's
			// goroutine asks again at once.)
			counts := map[string]string{}
			for _, k := range []string{"REJECTED_LOCAL_RESOURCES", "REJECTED_NO_ENDPOINT", "REJECTED_HOLDOFF"} {
				counts[k] = readValue(k)
			}
			assert.Equal(t, "1", counts["REJECTED_LOCAL_RESOURCES"])
			assert.Equal(t, "0", counts["REJECTED_NO_ENDPOINT"], "the shortage was counted as the endpoint's")
			assert.Equal(t, "0", counts["REJECTED_HOLDOFF"], "the shortage started a hold-off")
			require.NoError(t, ch.cmd.Wait())
		})
	}
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
	if os.Getenv(emfileFillEnv) == "" {
		io.Copy(io.Discard, os.Stdin)
	} else {
		fillWhenTold(t)
	}
	fmt.Printf("ACCEPT_ERRORS %v\n", metric(t, reg, "apifailover_localproxy_accept_errors_total"))
	for _, reason := range []string{"local_resources", "no_endpoint", "holdoff"} {
		fmt.Printf("REJECTED_%s %v\n", strings.ToUpper(reason), metric(t, reg, "apifailover_localproxy_connections_rejected_total", "reason", reason))
	}
}

// fillWhenTold reads commands from stdin until it ends: "fill" takes
// every free descriptor but one, "free" gives them back; each is
// answered FILLED or FREED.
func fillWhenTold(t *testing.T) {
	var held []*os.File
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "fill":
			for {
				f, err := os.Open(os.DevNull)
				if err != nil {
					require.ErrorIs(t, err, syscall.EMFILE)
					break
				}
				held = append(held, f)
			}
			require.NotEmpty(t, held)
			held[len(held)-1].Close()
			held = held[:len(held)-1]
			fmt.Println("FILLED")
		case "free":
			for _, f := range held {
				f.Close()
			}
			held = nil
			fmt.Println("FREED")
		}
	}
}
