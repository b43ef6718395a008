package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Profiles of the localproxy binary under the overhead ops, beside the
// results: go tool pprof -top <file>.
const (
	localproxyCPUProfile  = "localproxy-cpu.pprof"
	localproxyHeapProfile = "localproxy-heap.pprof"
)

// minProfileSeconds is the shortest CPU profile: enough samples (100 a
// second of CPU) for its top entries to mean something.
const minProfileSeconds = 20

// profileLocalProxy runs rounds of the overhead ops through the localproxy
// client (not recorded) while the binary (--profiling) takes a CPU profile
// as long as one round, and at least minProfileSeconds, then takes a heap
// profile, and writes both into out. A failure is reported and leaves the
// results alone.
func profileLocalProxy(ctx context.Context, c *overheadClient, cfg overheadConfig, out string, say func(string, ...any)) {
	base := "http://127.0.0.1:" + strconv.Itoa(localproxyHealthPort) + "/debug/pprof/"
	// How long a round takes: one timed round of every op first.
	began := time.Now()
	round := func() { c.round(ctx, cfg, func(string, sample) {}) }
	round()
	secs := max(int(math.Ceil(time.Since(began).Seconds())), minProfileSeconds)
	type result struct {
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		b, err := getBody(ctx, &http.Client{Timeout: time.Duration(secs+30) * time.Second}, base+"profile?seconds="+strconv.Itoa(secs))
		done <- result{b, err}
	}()
	// Until the profile ends: it began as the request arrived.
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		round()
	}
	r := <-done
	write := func(name string, b []byte, err error) {
		if err == nil {
			err = os.WriteFile(filepath.Join(out, name), b, 0o644)
		}
		if err != nil {
			say("  localproxy profile %s: %v", name, err)
			return
		}
		say("  localproxy profile: %s (go tool pprof -top %s)", filepath.Join(out, name), filepath.Join(out, name))
	}
	write(localproxyCPUProfile, r.body, r.err)
	b, err := getBody(ctx, &http.Client{Timeout: 30 * time.Second}, base+"heap")
	write(localproxyHeapProfile, b, err)
}

// overheadOps are the overhead measurement's ops, in the order each
// round runs them.
var overheadOps = []string{opGetSeq, opGetSparse, opGetConc, opList, opNewConn}

// opCount is how many requests of op the overhead measurement sends per
// path.
func opCount(cfg overheadConfig, op string) int {
	switch op {
	case opGetSeq:
		return cfg.GetSeq
	case opGetSparse:
		return cfg.GetSparse
	case opGetConc:
		return cfg.GetConc
	case opList:
		return cfg.Lists
	case opNewConn:
		return cfg.NewConn
	}
	return 0
}

// getBody GETs url with c and returns its body, an error unless 200.
func getBody(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return b, nil
}
