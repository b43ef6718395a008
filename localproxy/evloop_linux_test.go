package localproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/localproxy"
)

// A peer sends a blob, then, while the other end is not reading, a tail
// and its FIN: the loop may be waiting for the reader's socket when the
// FIN's edge comes, and that edge does not come again. The reader must
// get every byte and then the EOF, in both directions. (Before the loop
// kept the end seen, 2 of 90 such transfers lost the EOF.)
func TestLoopPassesOnAnEOFThatCameWhileWaiting(t *testing.T) {
	for _, size := range []int{300 << 10, 3 << 20, 8 << 20} {
		for _, tail := range []int{100, 20 << 10, 70 << 10} {
			name := fmt.Sprintf("%d+%d", size, tail)
			t.Run("to client "+name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t, func(c *net.TCPConn) {
					c.Write(make([]byte, size))
					time.Sleep(200 * time.Millisecond)
					c.Write(make([]byte, tail))
					c.CloseWrite()
					io.Copy(io.Discard, c)
				})
				r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
				c := dial(t, r.addr())
				time.Sleep(500 * time.Millisecond)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if n, err := io.Copy(io.Discard, c); err != nil || n != int64(size+tail) {
					t.Errorf("the client got %d of %d bytes, then %v", n, size+tail, err)
				}
			})
			t.Run("to upstream "+name, func(t *testing.T) {
				t.Parallel()
				got := make(chan error, 1)
				srv := newServer(t, func(c *net.TCPConn) {
					time.Sleep(500 * time.Millisecond)
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					n, err := io.Copy(io.Discard, c)
					if err == nil && n != int64(size+tail) {
						err = fmt.Errorf("got %d of %d bytes", n, size+tail)
					}
					got <- err
				})
				r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
				c := dial(t, r.addr())
				go func() {
					c.Write(make([]byte, size))
					time.Sleep(200 * time.Millisecond)
					c.Write(make([]byte, tail))
					c.(*net.TCPConn).CloseWrite()
				}()
				if err := <-got; err != nil {
					t.Errorf("the upstream: %v", err)
				}
			})
		}
	}
}

// The last bytes and the FIN of a sender arrive while the loop waits for
// the other side to take what came before (its socket is full): the FIN's
// edge does not come again, so the loop must keep it. Once the reader
// reads again it gets every byte, then the EOF, in both directions.
// Unlike the test above, this one stalls the loop on purpose: the sender
// goes on until the proxy's socket holds bytes it does not read.
func TestLoopKeepsAnEndThatCameWhileTheReaderWasFull(t *testing.T) {
	t.Run("to client", func(t *testing.T) {
		t.Parallel()
		sent := make(chan int, 1)
		srv := newServer(t, func(c *net.TCPConn) {
			if _, err := c.Read(make([]byte, 1)); err != nil {
				return
			}
			// The proxy reads what c sends from its socket to c.
			sent <- fillThenEnd(t, c, c.RemoteAddr(), c.LocalAddr())
			io.Copy(io.Discard, c)
		})
		r := start(t, stalledForLong(srv.addr()))
		d := net.Dialer{Control: smallRcvBuf}
		c, err := d.Dial("tcp", r.addr())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		n := <-sent
		require.True(t, r.CopyEnds()[0].OnLoop, "the connection is not on the loop")
		readAllAfterEnd(t, c, n)
	})
	t.Run("to upstream", func(t *testing.T) {
		t.Parallel()
		sent := make(chan int, 1)
		lc := net.ListenConfig{Control: smallRcvBuf}
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		require.NoError(t, err)
		read := make(chan struct{})
		srv := serveOn(t, ln, func(c *net.TCPConn) {
			readAllAfterEnd(t, c, <-sent)
			close(read)
		})
		r := start(t, stalledForLong(srv.addr()))
		c := dial(t, r.addr()).(*net.TCPConn)
		require.Eventually(t, func() bool { return len(r.CopyEnds()) == 1 }, 10*time.Second, 10*time.Millisecond)
		require.True(t, r.CopyEnds()[0].OnLoop, "the connection is not on the loop")
		// The proxy reads what c sends from its socket to c.
		sent <- fillThenEnd(t, c, c.RemoteAddr(), c.LocalAddr())
		<-read
	})
}

// stalledForLong is the Config of a proxy to endpoint whose reader is
// kept full on purpose, for as long as fillThenEnd takes (3-5s on an idle
// machine, over 10s on a loaded one): with no TCP_USER_TIMEOUT, which
// counts a window kept shut (Linux 5.11 and later), and after 10s, the
// default, has the kernel drop the socket the proxy cannot write to.
func stalledForLong(endpoint string) localproxy.Config {
	return localproxy.Config{Endpoints: []string{endpoint}, UserTimeout: -1, UpstreamUserTimeout: -1}
}

// fillThenEnd sends on w until the proxy, which reads w's bytes from its
// socket local (to remote), stops reading them: the other side is full.
// Then, once the loop has seen the queue grow, a short tail and the FIN,
// which may wait for the reader. It returns how many bytes it sends.
func fillThenEnd(t *testing.T, w *net.TCPConn, local, remote net.Addr) int {
	chunk := make([]byte, 16<<10)
	sent := 0
	for {
		if sent > 256<<20 {
			t.Errorf("the proxy read all of %d bytes: it never stalled", sent)
			break
		}
		// A write that blocks (w's buffer full) is cut short, and the
		// queue looked at.
		w.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := w.Write(chunk)
		sent += n
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("writing: %v", err)
			return sent
		}
		q, ok, err := rxQueue(local, remote)
		if ok && q > 0 {
			time.Sleep(20 * time.Millisecond)
			var again int
			if again, ok, err = rxQueue(local, remote); ok && again == q {
				break // not read for 20ms: waiting for the other side
			}
		}
		if err != nil { // on the server's goroutine: no FailNow
			t.Errorf("the proxy's receive queue: %v", err)
			break
		}
	}
	w.SetWriteDeadline(time.Time{})
	time.Sleep(20 * time.Millisecond)
	// The tail goes once the reader reads, if w's buffer is full: the
	// count is the reader's to wait for first.
	const tail = 100
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Write(make([]byte, tail))
		w.CloseWrite()
	}()
	t.Cleanup(func() {
		w.Close() // a tail the reader never took fails
		<-done
	})
	return sent + tail
}

// readAllAfterEnd waits for the FIN to reach the stalled loop, then reads
// c to its EOF, expecting want bytes.
func readAllAfterEnd(t *testing.T, c net.Conn, want int) {
	time.Sleep(100 * time.Millisecond)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != int64(want) {
		t.Errorf("got %d of %d bytes, then %v (want EOF)", n, want, err)
	}
}

// smallRcvBuf, a socket's Control, gives it a 4 KiB receive buffer, so
// that the proxy's writes to it stall early.
func smallRcvBuf(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	if err == nil {
		err = serr
	}
	return err
}

// rxQueue is how many bytes wait in the receive queue of this process's
// TCP socket from local to remote, both IPv4 (/proc/net/tcp, its
// addresses read as the proxy's hand-over reads them). ok is false when
// the table had no such line: a read of it can miss lines that move
// meanwhile.
func rxQueue(local, remote net.Addr) (q int, ok bool, err error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, false, err
	}
	is := func(field string, a net.Addr) bool {
		ip, port, err := localproxy.ParseProcAddr(field)
		ta := a.(*net.TCPAddr)
		return err == nil && port == ta.Port && ip.Equal(ta.IP)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !is(f[1], local) || !is(f[2], remote) {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		n, err := strconv.ParseInt(rx, 16, 64)
		if err != nil {
			return 0, false, fmt.Errorf("/proc/net/tcp: %q: %w", line, err)
		}
		return int(n), true, nil
	}
	return 0, false, nil
}

// A client sends TCP urgent data (MSG_OOB) amid its bytes: a read stops
// short at the urgent mark, with the rest queued and no edge to come. The
// upstream gets every ordinary byte without the client sending more, as
// with the copies on goroutines (the urgent byte is not inline: neither
// path passes it on).
func TestLoopPassesOnBytesAfterAnUrgentMark(t *testing.T) {
	got := make(chan string, 1)
	srv := newServer(t, func(c *net.TCPConn) {
		b := make([]byte, 6)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := io.ReadFull(c, b)
		got <- string(b[:n])
	})
	// A caller's listener: Go accepts, and the connection is handed to
	// the loop after its dial. All of it is queued then.
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, Listen: plainListen})
	defer r.OnLoopHandoff(func(func()) { time.Sleep(200 * time.Millisecond) })()
	c := dial(t, r.addr()).(*net.TCPConn)
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.Sendto(int(fd), []byte("abc"), 0, nil),
			unix.Sendto(int(fd), []byte("U"), unix.MSG_OOB, nil),
			unix.Sendto(int(fd), []byte("def"), 0, nil))
	}))
	require.NoError(t, serr)
	assert.Equal(t, "abcdef", <-got, "what the upstream got")
	assert.True(t, r.CopyEnds()[0].OnLoop, "the connection is not on the loop")
}

// A connection closed while it is handed to the loop (a registry event,
// a drain) closes its client gently, as without the loop: the client
// reads an EOF, not a reset, though it sent bytes the proxy did not read.
// (A caller's listener: Go accepts, and the connection is handed to the
// loop after its dial.)
func TestLoopClosesGentlyDuringTheHandoff(t *testing.T) {
	srv := newServer(t, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, Listen: plainListen})
	restore := r.OnLoopHandoff(func(close func()) {
		time.Sleep(100 * time.Millisecond) // the client's bytes arrive
		close()
	})
	defer restore()
	c := dial(t, r.addr())
	_, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 10))
	assert.ErrorIs(t, err, io.EOF, "the client's read")
}

// A direction that copied more than one event's share (a 64 MiB answer)
// is not taken for ended while its source stays open: that would cost a
// read per event for the rest of the connection.
func TestLoopHoldsOnlyAnEndedSourceForEnded(t *testing.T) {
	const size = 64 << 20
	srv := newServer(t, func(c *net.TCPConn) {
		c.Write(make([]byte, size))
		io.Copy(io.Discard, c) // open until the client closes
	})
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
	c := dial(t, r.addr())
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.CopyN(io.Discard, c, size)
	require.NoError(t, err)
	assert.Equal(t, [][2]bool{{false, false}}, r.LoopEnds(), "ended (toUpstream, toClient)")
	c.(*net.TCPConn).CloseWrite()
	require.Eventually(t, func() bool { e := r.LoopEnds(); return len(e) == 0 || e[0][0] }, 10*time.Second, 10*time.Millisecond)
}

// echoThrough opens conns connections to addr, in front of an echo
// server, at once; each sends size bytes and its EOF and reads the echo
// to its EOF within deadline. Each connection's error, or nil, comes on
// the channel.
func echoThrough(addr string, conns, size int, deadline time.Duration) <-chan error {
	errs := make(chan error, conns)
	for range conns {
		go func() {
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(deadline))
			go func() {
				c.Write(make([]byte, size))
				c.(*net.TCPConn).CloseWrite()
			}()
			n, err := io.Copy(io.Discard, c)
			if err == nil && n != int64(size) {
				err = fmt.Errorf("echoed %d of %d bytes", n, size)
			}
			errs <- err
		}()
	}
	return errs
}

// With one P the loop waits through Go's network poller instead of
// blocking a thread in epoll_wait (--gomaxprocs=1): connections copy, in
// both directions, to their EOFs, as with more.
func TestLoopWithOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := start(t, localproxy.Config{Endpoints: []string{newEcho(t).addr()}})
	const conns, size = 20, 1 << 20
	errs := echoThrough(r.addr(), conns, size, 20*time.Second)
	for range conns {
		assert.NoError(t, <-errs)
	}
	assert.Equal(t, "poller", r.LoopMode(), "how the loop waits")
}

// A direction that copied its share goes on after the others, and is on
// that list once however many edges step it meanwhile: each entry would
// copy another share ahead of the other connections.
func TestLoopQueuesADirectionOnce(t *testing.T) {
	r := start(t, localproxy.Config{Endpoints: []string{newEcho(t).addr()}})
	var lists, entries, repeated atomic.Int64
	defer r.OnLoopAgain(func(n, rep int) {
		lists.Add(1)
		entries.Add(int64(n))
		repeated.Add(int64(rep))
	})()
	const conns, size = 4, 64 << 20
	errs := echoThrough(r.addr(), conns, size, 60*time.Second)
	for range conns {
		require.NoError(t, <-errs)
	}
	t.Logf("%d lists, %d entries, %d repeated", lists.Load(), entries.Load(), repeated.Load())
	require.NotZero(t, lists.Load(), "no direction copied its share: the test did not reach the list")
	assert.Zero(t, repeated.Load(), "a direction was on the list more than once")
}
