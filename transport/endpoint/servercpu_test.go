package endpoint_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
)

// serverProcessEnv makes the test binary an API server stand-in (see
// TestServerProcess) whose CPU time is its own.
const serverProcessEnv = "ENDPOINT_TEST_SERVER_PROCESS"

// TestServerProcess is, in a child started by startServerProcess, an
// HTTP/2 (and HTTP/1.1) TLS server answering /readyz 200 with the
// certificate and key files named by serverProcessEnv. It prints its
// address, then its CPU time in nanoseconds for every line read from
// stdin, until stdin closes. Otherwise it does nothing.
func TestServerProcess(t *testing.T) {
	files := os.Getenv(serverProcessEnv)
	if files == "" {
		return
	}
	dir := filepath.Dir(files)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	fmt.Println(ln.Addr().String())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(int64(cpuTime()))
	}
	srv.Close()
	<-done
}

// serverProcess is a child running TestServerProcess.
type serverProcess struct {
	addr string
	in   io.Writer
	out  *bufio.Scanner
}

// startServerProcess starts a server for pki's origin in a child process,
// stopped when the test ends.
func startServerProcess(b *testing.B, pki *testPKI) *serverProcess {
	dir := b.TempDir()
	key, err := x509.MarshalPKCS8PrivateKey(pki.Cert.PrivateKey)
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(filepath.Join(dir, "server.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Cert.Certificate[0]}), 0o600))
	require.NoError(b, os.WriteFile(filepath.Join(dir, "server.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600))
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), serverProcessEnv+"="+filepath.Join(dir, "server.crt"))
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	p := &serverProcess{in: stdin, out: bufio.NewScanner(stdout)}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	require.True(b, p.out.Scan(), "server process address")
	p.addr = p.out.Text()
	return p
}

// cpu is the server's CPU time so far.
func (p *serverProcess) cpu(b *testing.B) time.Duration {
	_, err := p.in.Write([]byte("\n"))
	require.NoError(b, err)
	require.True(b, p.out.Scan())
	n, err := strconv.ParseInt(p.out.Text(), 10, 64)
	require.NoError(b, err)
	return time.Duration(n)
}

// BenchmarkServerCPU measures the server's CPU time, in a process of its
// own, per /readyz probe (ProbeReadyz resuming TLS sessions, ProbeHeld)
// and per PING of ProbeHeld between probes ("pings-N": N held
// connections at the default PingInterval; an op is one interval). A
// server otherwise idle wakes up for most PINGs: the fewer connections,
// the more a PING costs. The probes run in this process, on the same
// cores.
func BenchmarkServerCPU(b *testing.B) {
	pki := newPKI(b)
	srv := startServerProcess(b, pki)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.CAPEM)
	prober := func(mode endpoint.ProbeMode) *endpoint.Prober {
		p := &endpoint.Prober{Mode: mode, TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
		b.Cleanup(p.Close)
		return p
	}
	probes := func(mode endpoint.ProbeMode) func(b *testing.B) {
		return func(b *testing.B) {
			p := prober(mode)
			if err := p.Probe(b.Context(), srv.addr); err != nil {
				b.Fatal(err)
			}
			cpu0 := srv.cpu(b)
			for b.Loop() {
				if err := p.Probe(b.Context(), srv.addr); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(srv.cpu(b)-cpu0)/float64(b.N), "server-cpu-ns/op")
		}
	}
	b.Run("readyz", probes(endpoint.ProbeReadyz))
	b.Run("held", probes(endpoint.ProbeHeld))
	for _, conns := range []int{20, 200, 1000} {
		b.Run(fmt.Sprintf("pings-%d", conns), func(b *testing.B) {
			for range conns {
				if err := prober(endpoint.ProbeHeld).Probe(b.Context(), srv.addr); err != nil {
					b.Fatal(err)
				}
			}
			cpu0 := srv.cpu(b)
			for b.Loop() {
				time.Sleep(endpoint.DefaultPingInterval)
			}
			b.ReportMetric(float64(srv.cpu(b)-cpu0)/float64(b.N*conns), "server-cpu-ns/ping")
		})
	}
}
