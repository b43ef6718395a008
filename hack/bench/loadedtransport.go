package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// loadedTransport is the transport path (transport.Wrap with default
// options: held probes) in the bench process during the loaded run: GET
// newConnURLPath cfg.Rate times a second over its own connections, its
// pool's downs and suspicions counted as the other paths' are.
type loadedTransport struct {
	cp     *clientPath
	flaps  *flapCounter
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	lat      []time.Duration
	requests int
	failed   int
}

// startLoadedTransport starts the client and its requests.
func startLoadedTransport(ctx context.Context, e *env, cfg newConnConfig) (*loadedTransport, error) {
	cp, err := startTransport(ctx, e)
	if err != nil {
		return nil, err
	}
	if !waitUntil(ctx, settleLimit, cp.settled) {
		cp.close()
		return nil, fmt.Errorf("transport did not count every apiserver healthy within %s", settleLimit)
	}
	ctx, cancel := context.WithCancel(ctx)
	lt := &loadedTransport{cp: cp, flaps: watchFlaps(ctx, cp.views), cancel: cancel}
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
		if resp, err = lt.cp.httpClient.Do(req); err == nil {
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
	downs, suspects := lt.flaps.result()
	lt.cp.close()
	lt.mu.Lock()
	defer lt.mu.Unlock()
	slices.Sort(lt.lat)
	return NewConnLoadedRow{
		Path: pathTransport, Requests: lt.requests, Failed: lt.failed,
		P50ms: ms(percentile(lt.lat, 0.50)), P99ms: ms(percentile(lt.lat, 0.99)),
		Downs: &downs, Suspects: &suspects,
	}
}
