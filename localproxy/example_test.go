package localproxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"

	"github.com/apifailover/apifailover/localproxy"
)

// A node proxy in front of two API servers, one of them down: clients
// connect to the proxy's address and keep verifying the API server's
// certificate (localproxy forwards TLS untouched). Stand-in servers play
// the API servers here; the binary (cmd/localproxy) listens on
// 127.0.0.1:7445 and probes /readyz.
func Example() {
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "served by the live API server")
	}))
	defer api.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Print(err)
		return
	}
	deadAddr := dead.Addr().String()
	dead.Close() // connections to it are refused

	p, err := localproxy.New(localproxy.Config{
		Endpoints:       []string{deadAddr, api.Listener.Addr().String()},
		ListenAddresses: []string{"127.0.0.1:0"},
	})
	if err != nil {
		log.Print(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-p.Ready()

	roots := x509.NewCertPool()
	roots.AddCert(api.Certificate())
	client := &http.Client{Transport: &http.Transport{
		// As tls-server-name in a kubeconfig: the API server's name, not
		// the proxy's address.
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "example.com"},
	}}
	defer client.CloseIdleConnections()
	for range 2 {
		resp, err := client.Get("https://" + p.Addrs()[0].String() + "/")
		if err != nil {
			log.Print(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(string(body))
		client.CloseIdleConnections() // a new connection each time
	}
	// Output:
	// served by the live API server
	// served by the live API server
}
