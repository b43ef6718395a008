package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// loadedTransport is a transport.Wrap client with default options (held
// probes) in the bench process during the loaded run: GET newConnURLPath
// cfg.Rate times a second over its own connections, its pool's downs and
// suspicions counted from its events and status.
type loadedTransport struct {
	f      *transport.Failover
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	lat      []time.Duration
	requests int
	failed   int
	downs    int
	suspects int
}

// startLoadedTransport starts the client and its requests.
func startLoadedTransport(ctx context.Context, e *env, cfg newConnConfig) (*loadedTransport, error) {
	_, addrs := e.servers()
	f, err := transport.Wrap(ctx, e.bed.RESTConfig(testbed.Origin), transport.Options{Endpoints: addrs[1:], DisableDiscovery: true})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	lt := &loadedTransport{f: f, cancel: cancel}
	unsubscribe := f.Pool().Subscribe(func(ev upstream.Event) {
		if ev.Kind == upstream.EventDown {
			lt.mu.Lock()
			lt.downs++
			lt.mu.Unlock()
		}
	})
	lt.wg.Go(func() {
		defer unsubscribe()
		suspect := make(map[string]bool)
		tick := time.NewTicker(viewPoll)
		defer tick.Stop()
		for {
			for _, s := range f.Pool().Status() {
				if s.Suspect && !suspect[s.Addr] {
					lt.mu.Lock()
					lt.suspects++
					lt.mu.Unlock()
				}
				suspect[s.Addr] = s.Suspect
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	url := e.bed.RESTConfig(testbed.Origin).Host + newConnURLPath
	lt.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
		defer tick.Stop()
		var reqs sync.WaitGroup
		defer reqs.Wait()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			reqs.Go(func() { lt.get(ctx, url, cfg.Timeout) })
		}
	})
	return lt, nil
}

// get sends one GET and records it.
func (lt *loadedTransport) get(ctx context.Context, url string, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	ok := false
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = lt.f.HTTPClient().Do(req); err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ok = err == nil && resp.StatusCode == http.StatusOK
		}
	}
	if ctx.Err() != nil {
		return // the run ended: not counted
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.requests++
	if !ok {
		lt.failed++
		return
	}
	lt.lat = append(lt.lat, time.Since(start))
}

// stop ends the requests and closes the client; the row of the run.
func (lt *loadedTransport) stop() NewConnLoadedRow {
	lt.cancel()
	lt.wg.Wait()
	lt.f.Close()
	lt.mu.Lock()
	defer lt.mu.Unlock()
	slices.Sort(lt.lat)
	downs, suspects := lt.downs, lt.suspects
	return NewConnLoadedRow{
		Path: pathTransport, Requests: lt.requests, Failed: lt.failed,
		P50ms: ms(percentile(lt.lat, 0.50)), P99ms: ms(percentile(lt.lat, 0.99)),
		Downs: &downs, Suspects: &suspects,
	}
}
