package localproxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/apifailover/apifailover/localproxy"
)

// copyBenchChunk is the size of every write and read of the copy
// benchmarks: one op.
const copyBenchChunk = 64 << 10

// BenchmarkCopy measures the proxy's copy loop: a client connection over
// loopback, proxied to an upstream over loopback (two TCP connections
// spliced by the proxy), with the proxy's defaults (but no wait for open
// connections at shutdown) and no health probes.
// One op is 64 KiB: sent by the client to an upstream that discards it
// (upload), sent by an upstream that streams to the client (download), or
// sent by the client to an upstream that echoes it back, written and read
// concurrently (echo: the bytes cross the proxy twice). allocs/op counts
// the whole process: proxy, client and upstream (these two allocate
// nothing per op).
func BenchmarkCopy(b *testing.B) {
	b.Run("upload", func(b *testing.B) {
		c := copyBenchConn(b, func(c net.Conn) { copyBenchLoop(c.Read) })
		buf := make([]byte, copyBenchChunk)
		copyBenchRun(b, func() error { _, err := c.Write(buf); return err })
	})
	b.Run("download", func(b *testing.B) {
		c := copyBenchConn(b, func(c net.Conn) { copyBenchLoop(c.Write) })
		buf := make([]byte, copyBenchChunk)
		copyBenchRun(b, func() error { _, err := io.ReadFull(c, buf); return err })
	})
	b.Run("echo", func(b *testing.B) {
		c := copyBenchConn(b, func(c net.Conn) {
			buf := make([]byte, copyBenchChunk)
			for {
				n, err := c.Read(buf)
				if _, werr := c.Write(buf[:n]); werr != nil || err != nil {
					return
				}
			}
		})
		in, out := make([]byte, copyBenchChunk), make([]byte, copyBenchChunk)
		var wg sync.WaitGroup
		var werr error
		started := false
		copyBenchRun(b, func() error {
			if !started {
				// The first op starts the writer of all b.N chunks.
				started = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range b.N {
						if _, err := c.Write(out); err != nil {
							werr = err
							return
						}
					}
				}()
			}
			_, err := io.ReadFull(c, in)
			return err
		})
		wg.Wait()
		if werr != nil {
			b.Fatal(werr)
		}
	})
}

// copyBenchLoop calls op (a connection's Read or Write) with a chunk until
// it fails: the upstream's sink and source.
func copyBenchLoop(op func([]byte) (int, error)) {
	buf := make([]byte, copyBenchChunk)
	for {
		if _, err := op(buf); err != nil {
			return
		}
	}
}

// copyBenchRun times b.N calls of op, reporting copyBenchChunk bytes and
// the allocations of each.
func copyBenchRun(b *testing.B, op func() error) {
	b.SetBytes(copyBenchChunk)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

// copyBenchConn starts an upstream that greets every connection with one
// byte and then runs serve on it, and a proxy in front of it; it returns a
// client connection through the proxy that has read the greeting.
func copyBenchConn(b *testing.B, serve func(net.Conn)) net.Conn {
	b.Helper()
	up := benchUpstream(b, func(c net.Conn) {
		if _, err := c.Write([]byte{'>'}); err == nil {
			serve(c)
		}
	})
	c, err := net.Dial("tcp", benchProxy(b, up))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var greeting [1]byte
	if _, err := io.ReadFull(c, greeting[:]); err != nil {
		b.Fatal(errors.Join(errors.New("no greeting through the proxy"), err))
	}
	return c
}

// benchUpstream starts a server on loopback that runs serve for every
// connection until the benchmark ends, and returns its address.
func benchUpstream(b *testing.B, serve func(net.Conn)) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := make(map[net.Conn]struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// benchProxy runs a proxy in front of upstream with the proxy's defaults
// (but no wait for open connections at shutdown) and no health probes,
// until the benchmark ends, and returns its address.
func benchProxy(b *testing.B, upstream string) string {
	b.Helper()
	p, err := localproxy.New(localproxy.Config{
		Endpoints:       []string{upstream},
		ListenAddresses: []string{"127.0.0.1:0"},
		// The benchmark's connections end with it.
		ShutdownTimeout: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	// Registered before the upstream's cleanup runs: cleanups run last
	// first, so the proxy stops before the upstream closes.
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	<-p.Ready()
	return p.Addrs()[0].String()
}
