package localproxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// readProxyHeader reads one PROXY protocol header (v1 or v2) from c, no
// byte more, and describes it: "v1 UNKNOWN", "v1 TCP6 ::1 ::1 1 2",
// "v2 LOCAL", "v2 PROXY 127.0.0.1:1->127.0.0.1:2". It is the receiving
// side of a proxy that requires the header (HAProxy's accept-proxy).
func readProxyHeader(c net.Conn) (string, error) {
	first := make([]byte, 5)
	if _, err := io.ReadFull(c, first); err != nil {
		return "", err
	}
	if string(first) == "PROXY" {
		line := first
		b := make([]byte, 1)
		for !bytes.HasSuffix(line, []byte("\r\n")) {
			if len(line) > 107 { // the longest v1 header
				return "", fmt.Errorf("v1 header too long: %q", line)
			}
			if _, err := io.ReadFull(c, b); err != nil {
				return "", err
			}
			line = append(line, b[0])
		}
		f := strings.Fields(strings.TrimSuffix(string(line), "\r\n"))
		switch {
		case len(f) >= 2 && f[1] == "UNKNOWN":
			return "v1 UNKNOWN", nil
		case len(f) == 6 && (f[1] == "TCP4" || f[1] == "TCP6"):
			return "v1 " + strings.Join(f[1:], " "), nil
		}
		return "", fmt.Errorf("bad v1 header %q", line)
	}
	rest := make([]byte, 11)
	if _, err := io.ReadFull(c, rest); err != nil {
		return "", err
	}
	hdr := append(first, rest...)
	if !bytes.Equal(hdr[:12], []byte("\r\n\r\n\x00\r\nQUIT\n")) {
		return "", fmt.Errorf("no PROXY header: %q", hdr)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[14:16]))
	if _, err := io.ReadFull(c, body); err != nil {
		return "", err
	}
	switch cmd, fam := hdr[12], hdr[13]; {
	case cmd == 0x20:
		return "v2 LOCAL", nil
	case cmd == 0x21 && fam == 0x11 && len(body) == 12:
		return fmt.Sprintf("v2 PROXY %s->%s", addrPort(body[0:4], body[8:10]), addrPort(body[4:8], body[10:12])), nil
	case cmd == 0x21 && fam == 0x21 && len(body) == 36:
		return fmt.Sprintf("v2 PROXY %s->%s", addrPort(body[0:16], body[32:34]), addrPort(body[16:32], body[34:36])), nil
	}
	return "", fmt.Errorf("bad v2 header %x %x", hdr, body)
}

func addrPort(ip, port []byte) string {
	return net.JoinHostPort(net.IP(ip).String(), fmt.Sprint(binary.BigEndian.Uint16(port)))
}

// headerListener requires a PROXY header on every connection it accepts
// and records it; a connection without a valid one is closed.
type headerListener struct {
	net.Listener
	mu   sync.Mutex
	seen []string
}

func (l *headerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		h, err := readProxyHeader(c)
		c.SetReadDeadline(time.Time{})
		l.mu.Lock()
		if err != nil {
			h = "invalid: " + err.Error()
		}
		l.seen = append(l.seen, h)
		l.mu.Unlock()
		if err != nil {
			c.Close()
			continue
		}
		return c, nil
	}
}

func (l *headerListener) headers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// TestProxyProtocolHeaders: the header a proxied connection carries, over
// IPv4 and IPv6, as a receiving proxy reads it.
func TestProxyProtocolHeaders(t *testing.T) {
	for _, tc := range []struct{ name, loop string }{{"ipv4", "127.0.0.1"}, {"ipv6", "::1"}} {
		for _, v := range []localproxy.ProxyProtocol{localproxy.ProxyProtocolV1, localproxy.ProxyProtocolV2} {
			t.Run(tc.name+"/"+string(v), func(t *testing.T) {
				ln, err := net.Listen("tcp", net.JoinHostPort(tc.loop, "0"))
				if err != nil {
					t.Skipf("cannot listen on %s: %v", tc.loop, err)
				}
				got := make(chan string, 1)
				srv := serveOn(t, ln, func(c *net.TCPConn) {
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					h, err := readProxyHeader(c)
					if err != nil {
						h = "invalid: " + err.Error()
					}
					got <- h
					io.Copy(c, c) // then echo
				})
				r := start(t, localproxy.Config{
					Endpoints:       []string{srv.addr()},
					ListenAddresses: []string{net.JoinHostPort(tc.loop, "0")},
					ProxyProtocol:   v,
				})
				c := dial(t, r.addr())
				require.NoError(t, roundTrip(c, "after the header"))
				src, dst := c.LocalAddr().(*net.TCPAddr), c.RemoteAddr().(*net.TCPAddr)
				want := fmt.Sprintf("v2 PROXY %s->%s", src, dst)
				if v == localproxy.ProxyProtocolV1 {
					fam := "TCP4"
					if src.IP.To4() == nil {
						fam = "TCP6"
					}
					want = fmt.Sprintf("v1 %s %s %s %d %d", fam, src.IP, dst.IP, src.Port, dst.Port)
				}
				assert.Equal(t, want, <-got)
			})
		}
	}
}

// TestProxyProtocolProbes: behind a proxy that requires the PROXY
// protocol, /readyz probes carry the LOCAL header, so the endpoint is
// healthy and clients' TLS reaches it through localproxy.
func TestProxyProtocolProbes(t *testing.T) {
	for _, v := range []localproxy.ProxyProtocol{localproxy.ProxyProtocolV1, localproxy.ProxyProtocolV2} {
		t.Run(string(v), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			hl := &headerListener{Listener: ln}
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "ok")
			}))
			srv.Listener = hl
			srv.StartTLS()
			t.Cleanup(srv.Close)

			roots := x509.NewCertPool()
			roots.AddCert(srv.Certificate())
			tlsCfg := &tls.Config{RootCAs: roots, ServerName: "example.com"}
			r := start(t, localproxy.Config{
				Endpoints:     []string{hl.Addr().String()},
				ProxyProtocol: v,
				Probe:         &endpoint.ProbeConfig{Mode: endpoint.ProbeReadyz, ServerName: "example.com", RootCAs: roots},
				Pool:          upstream.Config{Interval: time.Second, Timeout: 900 * time.Millisecond, Rise: 1, Fall: 1},
			})
			if !assert.Eventually(t, func() bool {
				st := r.Pool().Status()
				return len(st) == 1 && st[0].State == upstream.StateHealthy
			}, 10*time.Second, 10*time.Millisecond) {
				t.Fatalf("the endpoint behind the PROXY-protocol listener never became healthy: headers %v", hl.headers())
			}
			probeHdr := "v1 UNKNOWN"
			if v == localproxy.ProxyProtocolV2 {
				probeHdr = "v2 LOCAL"
			}
			assert.Equal(t, probeHdr, hl.headers()[0], "the first connection is a probe")

			// A client's TLS connection through the proxy, with the
			// client's addresses in the header.
			hc := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", r.addr())
				},
				TLSClientConfig: tlsCfg,
			}}
			t.Cleanup(hc.CloseIdleConnections)
			resp, err := hc.Get("https://example.com/version")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "ok", string(body))
			var clientHdrs []string
			for _, h := range hl.headers() {
				if h != probeHdr {
					clientHdrs = append(clientHdrs, h)
				}
			}
			require.Len(t, clientHdrs, 1, "headers: %v", hl.headers())
			prefix := "v1 TCP4 127.0.0.1 127.0.0.1 "
			if v == localproxy.ProxyProtocolV2 {
				prefix = "v2 PROXY 127.0.0.1:"
			}
			assert.True(t, strings.HasPrefix(clientHdrs[0], prefix), "client header %q", clientHdrs[0])
		})
	}
}

// TestProbeDialer: a dial that cannot send its header fails, and closes
// what it opened.
func TestProbeDialer(t *testing.T) {
	_, err := localproxy.ProbeDialer(localproxy.ProxyProtocolNone)
	require.Error(t, err)
	dial, err := localproxy.ProbeDialer(localproxy.ProxyProtocolV2)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = dial(ctx, "tcp", "127.0.0.1:"+freeLocalPort(t))
	var oe *net.OpError
	require.True(t, errors.As(err, &oe), "dialing a closed port: %v", err)
}

// TestProxyProtocolNames: the spellings Config accepts are normalized, so
// "none" sends no header.
func TestProxyProtocolNames(t *testing.T) {
	got := make(chan []byte, 1)
	srv := newServer(t, func(c *net.TCPConn) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 64)
		n, _ := c.Read(b)
		got <- b[:n]
	})
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, ProxyProtocol: "none"})
	c := dial(t, r.addr())
	_, err := c.Write([]byte("hello"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(<-got))
}
