// Command prober is the chaos soak's kubelet: a process of its own that
// asks a URL every -every on a new connection, as kubelet's HTTP probes
// do, with -timeout to answer, and writes one JSON line per probe to
// standard output ({"start", "seconds", "status", "error"}) until SIGTERM.
// The soak's own process is too busy (its clients, under the race
// detector) to stand for kubelet: a probe it starves between connecting
// and writing its request looks like an idle connection to a health
// server under attack.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Result is one probe.
type Result struct {
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`
	Status  int       `json:"status,omitempty"`
	Error   string    `json:"error,omitempty"`
}

func main() {
	url := flag.String("url", "", "what to probe, e.g. http://127.0.0.1:7446/readyz")
	every := flag.Duration("every", 250*time.Millisecond, "time between probes")
	timeout := flag.Duration("timeout", time.Second, "how long a probe may take")
	flag.Parse()
	if *url == "" || *every <= 0 || *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "prober: -url is required; -every and -timeout must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hc := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	enc := json.NewEncoder(os.Stdout)
	t := time.NewTicker(*every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r := Result{Start: time.Now()}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
		resp, err := hc.Do(req)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			r.Status = resp.StatusCode
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		} else {
			r.Error = err.Error()
		}
		r.Seconds = time.Since(r.Start).Seconds()
		if enc.Encode(r) != nil {
			return // the soak is gone
		}
	}
}
