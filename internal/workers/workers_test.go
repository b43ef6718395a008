package workers_test

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/internal/leakcheck"
	"github.com/apifailover/apifailover/internal/workers"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// goroutineID is the calling goroutine's number, from its stack header.
func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return string(bytes.Fields(b)[1])
}

// run runs f on p and waits for it to return, giving the ID of the
// goroutine that ran it.
func run(p *workers.Pool, f func()) string {
	done := make(chan string)
	p.Go(func() {
		f()
		done <- goroutineID()
	})
	return <-done
}

// waitIdle waits until at least n workers wait for a function.
func waitIdle(t *testing.T, p *workers.Pool, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return p.Idle() >= n }, 5*time.Second, time.Millisecond, "want %d idle workers", n)
}

// A function after another that returned runs on a goroutine that ran one
// before, and functions that run at the same time each get one.
func TestPoolReusesWorkers(t *testing.T) {
	var p workers.Pool
	defer p.Close()
	// A worker counts itself idle just before it waits: a Go in between
	// starts another worker. Rare, but the count allows for a few.
	const rounds = 20
	seen := map[string]bool{run(&p, func() {}): true}
	for range rounds - 1 {
		waitIdle(t, &p, 1)
		seen[run(&p, func() {})] = true
	}
	assert.Less(t, len(seen), rounds/2, "sequential functions ran on new goroutines")

	release := make(chan struct{})
	var started sync.WaitGroup
	ids := make(chan string, 3)
	for range 3 {
		started.Add(1)
		p.Go(func() {
			started.Done()
			<-release
			ids <- goroutineID()
		})
	}
	started.Wait()
	close(release)
	at := map[string]bool{}
	for range 3 {
		at[<-ids] = true
	}
	assert.Len(t, at, 3, "functions running at the same time shared a goroutine")
	waitIdle(t, &p, 3)
}

// A worker with nothing to do for Linger exits.
func TestPoolWorkerLingers(t *testing.T) {
	p := workers.Pool{Linger: 20 * time.Millisecond}
	defer p.Close()
	run(&p, func() {})
	waitIdle(t, &p, 1)
	require.Eventually(t, func() bool { return p.Idle() == 0 }, 5*time.Second, time.Millisecond, "the idle worker did not exit")
	// The next function gets a new worker.
	run(&p, func() {})
	waitIdle(t, &p, 1)
}

// Close ends the idle workers, waits for the busy ones, and leaves later
// functions to goroutines of their own.
func TestPoolClose(t *testing.T) {
	var p workers.Pool
	run(&p, func() {})
	waitIdle(t, &p, 1)
	release := make(chan struct{})
	busy := make(chan struct{})
	p.Go(func() {
		close(busy)
		<-release
	})
	<-busy
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a worker was busy")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	assert.Equal(t, 0, p.Idle())
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	<-ran
	p.Close() // again: no-op
}
