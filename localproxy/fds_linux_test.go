package localproxy_test

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// An idle proxied connection holds its two sockets and nothing else: no
// splice pipe waits for data on its behalf. In this process a connection
// is four sockets: the client's, the proxy's two and the echo upstream's.
func TestIdleConnectionHoldsNoPipe(t *testing.T) {
	const n = 100
	// An echo that copies through a buffer: one that splices (io.Copy
	// between TCP connections) would hold a pipe per connection itself.
	echo := newServer(t, func(c *net.TCPConn) {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				c.CloseWrite()
				return
			}
		}
	})
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	// openFDs counts the descriptors in this process, pipes apart. Pipes
	// that Go's splice keeps in its pool for reuse are not held by a
	// connection: two garbage collections empty the pool and close them.
	openFDs := func() (fds, pipes int) {
		for range 2 {
			runtime.GC()
		}
		time.Sleep(10 * time.Millisecond) // the pipes' finalizers
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		for _, e := range ents {
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
				pipes++
			} else {
				fds++
			}
		}
		return fds, pipes
	}
	// One connection first, so that pools and the poller are set up.
	warm := dial(t, r.addr())
	require.NoError(t, roundTrip(warm, "warm"))
	fds0, pipes0 := openFDs()
	var conns []net.Conn
	for i := range n {
		c := dial(t, r.addr())
		// Past the first bytes, which are copied in user space: the
		// copies that follow are the ones that would splice.
		for j := range 3 {
			require.NoError(t, roundTrip(c, fmt.Sprintf("conn %d message %d", i, j)))
		}
		conns = append(conns, c)
	}
	fds, pipes := openFDs()
	t.Logf("per idle connection in this process: %.2f sockets, %.2f pipe descriptors", float64(fds-fds0)/n, float64(pipes-pipes0)/n)
	assert.LessOrEqual(t, pipes-pipes0, 4, "idle connections hold splice pipes")
	assert.LessOrEqual(t, float64(fds-fds0)/n, 4.1)
	for _, c := range conns {
		require.NoError(t, roundTrip(c, "still there"))
	}
}

// connsOnPort counts this process's descriptors that are TCP connections
// (listeners apart) with the local port port: on a server's port, the
// connections it holds open. ok is false if /proc cannot tell.
func connsOnPort(t *testing.T, port int) (n int, ok bool) {
	t.Helper()
	// /proc/net/tcp{,6}: "sl local_address rem_address st ... inode"
	// with addresses as hex "ADDR:PORT" and st 0A for LISTEN.
	onPort := make(map[string]bool) // "socket:[inode]"
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) && f == "/proc/net/tcp6" {
			continue // no IPv6
		}
		if err != nil {
			return 0, false
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 10 || fields[3] == "0A" {
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				onPort["socket:["+fields[9]+"]"] = true
			}
		}
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && onPort[l] {
			n++
		}
	}
	return n, true
}
