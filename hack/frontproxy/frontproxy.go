// Package frontproxy is a TLS reverse proxy in front of the test bed's API
// servers that advertises them with Alt-Svc: it emulates a control plane
// whose entry point sends Alt-Svc headers (upstream kube-apiserver does
// not), so the altsvc client can be tested end to end.
package frontproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

// Config configures a Proxy.
type Config struct {
	// Addr to listen on, host:port. Required.
	Addr string
	// Certificate served to clients (the API servers' serving certificate,
	// valid for the origin name). Required.
	Certificate tls.Certificate
	// CAPEM verifies the backends; ServerName is the name they are
	// verified for. Required.
	CAPEM      []byte
	ServerName string
	// Backends returns the API servers (host:port) to proxy to and to
	// advertise. Required.
	Backends func() []string
	// AdvertiseMaxAge is the Alt-Svc ma. If zero, altsvc's default.
	AdvertiseMaxAge time.Duration
	// ClientCIDRs limits who gets the Alt-Svc header. If empty, everyone.
	ClientCIDRs []netip.Prefix
}

// Proxy is a running front proxy.
type Proxy struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	// Requests counts proxied API requests; health checks (/readyz,
	// /livez, /healthz) are not counted.
	Requests atomic.Int64
}

// Start listens on cfg.Addr and serves until Kill or Close.
func Start(cfg Config) (*Proxy, error) {
	if cfg.Backends == nil || cfg.ServerName == "" || len(cfg.CAPEM) == 0 {
		return nil, errors.New("frontproxy: Backends, ServerName and CAPEM are required")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.CAPEM) {
		return nil, errors.New("frontproxy: CAPEM holds no certificate")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("frontproxy: %w", err)
	}
	p := &Proxy{ln: ln, done: make(chan struct{})}
	var next atomic.Uint64
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			backends := cfg.Backends()
			if len(backends) == 0 {
				return
			}
			b := backends[next.Add(1)%uint64(len(backends))]
			r.Out.URL.Scheme = "https"
			r.Out.URL.Host = b
			r.Out.Host = cfg.ServerName
		},
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: cfg.ServerName},
			ForceAttemptHTTP2: true,
		},
		FlushInterval: -1, // watches stream
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz", "/livez", "/healthz":
		default:
			p.Requests.Add(1)
		}
		rp.ServeHTTP(w, r)
	})
	p.srv = &http.Server{
		Handler: altsvc.NewHandler(counted, altsvc.HandlerConfig{
			Endpoints:   cfg.Backends,
			MaxAge:      cfg.AdvertiseMaxAge,
			ClientCIDRs: cfg.ClientCIDRs,
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cfg.Certificate}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(p.done)
		p.srv.ServeTLS(ln, "", "")
	}()
	return p, nil
}

// Addr returns the listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Kill closes the listener and every connection at once, like a crashed
// load balancer.
func (p *Proxy) Kill() {
	p.srv.Close()
	<-p.done
}

// Close shuts down gracefully within ctx, then kills what is left.
func (p *Proxy) Close(ctx context.Context) error {
	err := p.srv.Shutdown(ctx)
	p.Kill()
	return err
}
