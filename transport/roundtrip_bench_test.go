package transport_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/apifailover/apifailover/transport"
)

// directClient is the baseline: a plain http.Transport (HTTP/2, same TLS
// trust) to the same server.
func directClient(b *testing.B, c *cluster) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.CAPEM)
	t := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: originName},
		ForceAttemptHTTP2: true,
	}
	b.Cleanup(t.CloseIdleConnections)
	return &http.Client{Transport: t}
}

func doGet(b *testing.B, hc *http.Client, url string) {
	resp, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// BenchmarkRoundTrip compares a GET through the failover transport with the
// same GET through a plain http.Transport to the same HTTP/2 server, in the
// same run. The ratio sub-benchmark alternates the two and reports
// failover/direct as "ratio".
func BenchmarkRoundTrip(b *testing.B) {
	c := newCluster(b, 1)
	url := "https://" + c.servers[0].addr + "/api"
	direct := directClient(b, c)
	f, err := transport.Wrap(b.Context(), c.config(), transport.Options{DisableDiscovery: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	failover := f.HTTPClient()
	doGet(b, direct, url)
	doGet(b, failover, url)

	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			doGet(b, direct, url)
		}
	})
	b.Run("failover", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			doGet(b, failover, url)
		}
	})
	b.Run("ratio", func(b *testing.B) {
		var td, tf time.Duration
		for b.Loop() {
			s := time.Now()
			doGet(b, direct, url)
			td += time.Since(s)
			s = time.Now()
			doGet(b, failover, url)
			tf += time.Since(s)
		}
		b.ReportMetric(float64(tf)/float64(td), "ratio")
		b.ReportMetric(float64(tf-td)/float64(b.N), "overhead-ns/op")
	})
}
