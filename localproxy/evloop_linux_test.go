package localproxy_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

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
