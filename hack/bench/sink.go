package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/peers"
)

// The sink is the synthetic upstream of the data-path measurement: a
// plain TCP server in a process of its own in the bed's network namespace that discards what a client sends, streams bytes to it, or
// holds its connection idle. It passes the contenders' health checks as an
// apiserver would: a connection that starts with a TLS handshake gets the
// bed's apiserver certificate and 200 for any HTTP GET (/healthz,
// /readyz), so every contender runs its usual health checks against it.

// Sink requests: the first byte of a connection, followed by a
// big-endian uint64 (a byte count for sinkSource, unused otherwise). The
// sink answers every request with sinkAck at once, so that no contender
// counts it silent.
const (
	// sinkDiscard: the sink reads the count of bytes, then sends the
	// number it read (big-endian uint64) and closes. (No half-close:
	// kubespray's nginx ends the session on the client's.)
	sinkDiscard = 'D'
	// sinkSource: the sink sends the count of bytes, then closes.
	sinkSource = 'S'
	// sinkIdle: the sink reads (and discards) until the client closes.
	sinkIdle   = 'I'
	sinkAck    = '+'
	sinkHeader = 9
	// sinkBuffer is the size of every read and write of the sink and of
	// the clients.
	sinkBuffer = 256 << 10
	// tlsHandshake is the first byte of a TLS record carrying a handshake.
	tlsHandshake = 0x16
)

// sinkCommand, as the bench binary's first argument, makes it the sink:
// bench sink CERT KEY ADDR... serves on every ADDR, with the certificate
// and key in the PEM files CERT and KEY, until it is killed. The sink runs
// as a process of its own so that the ends of the idle connections, the
// client's and the sink's, count against two file descriptor limits.
const sinkCommand = "sink"

// sinkMain is the sink process.
func sinkMain(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: bench sink CERT KEY ADDR...")
		return 2
	}
	cert, err := tls.LoadX509KeyPair(args[0], args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		return 1
	}
	s := newSink(cert)
	// The last address first: the bench waits for the first.
	for _, addr := range slices.Backward(args[2:]) {
		if err := s.listen(addr); err != nil {
			fmt.Fprintln(os.Stderr, "sink:", err)
			return 1
		}
	}
	select {}
}

// startSink starts the sink process listening on addrs, with cert, its
// files and log in dir, started with opts; it waits until wait accepts
// connections.
func startSink(ctx context.Context, dir string, cert tls.Certificate, addrs []string, wait string, opts peers.ProcOptions) (*proc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(dir, "sink.crt"), filepath.Join(dir, "sink.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startProcWith(ctx, opts, "sink", filepath.Join(dir, "sink.log"), wait, exe, append([]string{sinkCommand, certFile, keyFile}, addrs...)...)
}

// sink serves the sink protocol on any number of listeners.
type sink struct {
	health *http.Server
	tlsIn  *connListener

	mu    sync.Mutex // guards lns, conns
	lns   []net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// newSink starts the sink's health server with cert.
func newSink(cert tls.Certificate) *sink {
	s := &sink{conns: make(map[net.Conn]bool), tlsIn: newConnListener()}
	s.health = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
		// Health checks that hang up mid-handshake are no news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.health.ServeTLS(s.tlsIn, "", "")
	}()
	return s
}

// listen adds a listener on addr.
func (s *sink) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.track(c, true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c)
			}()
		}
	}()
	return nil
}

func (s *sink) track(c net.Conn, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if open {
		s.conns[c] = true
	} else {
		delete(s.conns, c)
	}
}

// serve answers one connection.
func (s *sink) serve(c net.Conn) {
	br := bufio.NewReaderSize(c, 16) // reads of sinkBuffer bypass it
	first, err := br.Peek(1)
	if err == nil && first[0] == tlsHandshake {
		s.track(c, false) // the health server owns it now
		s.tlsIn.push(&peekedConn{Conn: c, r: br})
		return
	}
	defer func() {
		s.track(c, false)
		c.Close()
	}()
	var hdr [sinkHeader]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return
	}
	if _, err := c.Write([]byte{sinkAck}); err != nil {
		return
	}
	buf := make([]byte, sinkBuffer)
	switch hdr[0] {
	case sinkDiscard:
		n, err := drain(io.LimitReader(br, int64(binary.BigEndian.Uint64(hdr[1:]))), buf)
		if err != nil {
			return
		}
		var out [8]byte
		binary.BigEndian.PutUint64(out[:], uint64(n))
		_, _ = c.Write(out[:])
	case sinkSource:
		_ = fill(c, buf, int64(binary.BigEndian.Uint64(hdr[1:])))
	case sinkIdle:
		_, _ = drain(br, buf)
	}
}

// drain reads r until EOF into buf and returns the byte count.
func drain(r io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// fill writes n bytes of buf (repeated) to w.
func fill(w io.Writer, buf []byte, n int64) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// close stops the listeners and the health server and closes every
// connection.
func (s *sink) close() {
	s.mu.Lock()
	for _, ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	_ = s.health.Close()
	s.wg.Wait()
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r io.Reader
}

func (c *peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// connListener hands connections accepted elsewhere to an http.Server.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// sinkDial opens a connection to addr (a contender in front of the sink,
// or the sink), sends the request and waits for the sink's answer.
func sinkDial(addr string, mode byte, n int64, timeout time.Duration) (*net.TCPConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	var hdr [sinkHeader]byte
	hdr[0] = mode
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	_ = tc.SetDeadline(time.Now().Add(timeout))
	var ack [1]byte
	if _, err := tc.Write(hdr[:]); err != nil {
		tc.Close()
		return nil, err
	}
	if _, err := io.ReadFull(tc, ack[:]); err != nil {
		tc.Close()
		return nil, fmt.Errorf("no answer from the sink: %w", err)
	}
	if ack[0] != sinkAck {
		tc.Close()
		return nil, fmt.Errorf("sink answered %q", ack[0])
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// transfer sends n bytes to the sink through addr (mode sinkDiscard) or
// reads n bytes from it (sinkSource), and returns the time from the sink's
// answer to the last byte's arrival (sinkDiscard: the sink's count of the
// bytes it received).
func transfer(addr string, mode byte, n int64, buf []byte) (time.Duration, error) {
	c, err := sinkDial(addr, mode, n, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	began := time.Now()
	var got int64
	if mode == sinkDiscard {
		if err := fill(c, buf, n); err != nil {
			return 0, err
		}
		var count [8]byte
		if _, err := io.ReadFull(c, count[:]); err != nil {
			return 0, fmt.Errorf("reading the sink's count: %w", err)
		}
		got = int64(binary.BigEndian.Uint64(count[:]))
	} else if got, err = drain(c, buf); err != nil {
		return 0, err
	}
	d := time.Since(began)
	if got != n {
		return 0, fmt.Errorf("%d bytes of %d arrived", got, n)
	}
	return d, nil
}
