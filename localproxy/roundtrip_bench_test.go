//go:build unix

package localproxy_test

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// Request and response sizes of BenchmarkRoundTrip: a small GET over
// HTTP/2 and TLS, and a LIST of a few hundred objects.
const (
	rtRequest   = 200
	rtResponse  = 2 << 10
	rtList      = 320 << 10
	rtSizeBytes = 4 // the request's first bytes: the response size
)

// BenchmarkRoundTrip measures what API requests cost, which are small
// messages: one op is a request of rtRequest bytes written by the client
// and a response read back whole, on one connection (get: 2 KiB; list:
// 320 KiB), or on a new connection each time (newconn: connect, a get,
// close). Each runs direct (client to upstream) and through the proxy;
// the difference is the proxy's. cpu-us/op is the whole process's CPU
// time (getrusage: proxy, client and upstream) per op.
func BenchmarkRoundTrip(b *testing.B) {
	for _, via := range []string{"direct", "proxy"} {
		target := func(b *testing.B) string {
			up := benchUpstream(b, rtServe)
			if via == "direct" {
				return up
			}
			return benchProxy(b, up)
		}
		b.Run("get/"+via, func(b *testing.B) {
			c := rtDial(b, target(b))
			defer c.Close()
			rtRun(b, rtResponse, func(req, resp []byte) error { return rtExchange(c, req, resp) })
		})
		b.Run("list/"+via, func(b *testing.B) {
			c := rtDial(b, target(b))
			defer c.Close()
			rtRun(b, rtList, func(req, resp []byte) error { return rtExchange(c, req, resp) })
		})
		b.Run("newconn/"+via, func(b *testing.B) {
			addr := target(b)
			rtRun(b, rtResponse, func(req, resp []byte) error {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					return err
				}
				defer c.Close()
				return rtExchange(c, req, resp)
			})
		})
	}
}

// rtRun times b.N calls of op with a request asking for a response of
// size bytes, and reports allocations and CPU time per op.
func rtRun(b *testing.B, size int, op func(req, resp []byte) error) {
	req := make([]byte, rtRequest)
	req[0], req[1], req[2], req[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	resp := make([]byte, size)
	// One op outside the timing: connections and pools set up.
	if err := op(req, resp); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for range b.N {
		if err := op(req, resp); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
}

// rtExchange writes req on c and reads a response filling resp.
func rtExchange(c net.Conn, req, resp []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	_, err := io.ReadFull(c, resp)
	return err
}

func rtDial(b *testing.B, addr string) net.Conn {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// rtServe answers every request of rtRequest bytes on c with as many
// bytes as its first rtSizeBytes ask for (big-endian, at most rtList),
// until c ends.
func rtServe(c net.Conn) {
	req := make([]byte, rtRequest)
	var resp []byte
	for {
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		size := min(int(req[0])<<24|int(req[1])<<16|int(req[2])<<8|int(req[3]), rtList)
		if cap(resp) < size {
			resp = make([]byte, size)
		}
		if _, err := c.Write(resp[:size]); err != nil {
			return
		}
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
