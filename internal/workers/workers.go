// Package workers runs functions on goroutines that outlive them.
//
// A goroutine starts with a small stack that grows, by copying, as deep
// calls need it: net.Dialer.DialContext and a proxied connection's setup
// grow it two or three times. A proxy that starts such goroutines for every
// new connection spends a tenth of its CPU on those copies and on creating
// the goroutines. A Pool hands each function to a goroutine that waits for
// work, with the stack its earlier functions grew, and starts one only
// when none waits.
package workers

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLinger is how long a Pool's worker waits for a function before it
// exits, if Pool.Linger is zero.
const DefaultLinger = 10 * time.Second

// Pool runs functions on waiting workers. The zero value is ready to use.
// Close stops its idle workers; after Close, Go runs each function on a
// goroutine of its own.
type Pool struct {
	// Linger is how long a worker waits for the next function before it
	// exits. If zero, DefaultLinger.
	Linger time.Duration

	once   sync.Once
	work   chan func()   // unbuffered: a send succeeds only to a waiting worker
	quit   chan struct{} // closed by Close
	mu     sync.RWMutex
	closed bool // under mu; Close closed quit
	wg     sync.WaitGroup
	idle   atomic.Int32 // workers waiting for a function
}

func (p *Pool) init() {
	p.once.Do(func() {
		p.work = make(chan func())
		p.quit = make(chan struct{})
	})
}

// Go runs f on a waiting worker, or on a new one if none waits. After Close
// it runs f on a goroutine of its own.
func (p *Pool) Go(f func()) {
	p.init()
	select {
	case p.work <- f:
		return
	default:
	}
	p.mu.RLock()
	closed := p.closed
	if !closed {
		p.wg.Add(1) // before Close can wait
	}
	p.mu.RUnlock()
	if closed {
		go f()
		return
	}
	go p.worker(f)
}

// worker runs f, then the functions it is handed, until it waits Linger
// with none or the Pool closes.
func (p *Pool) worker(f func()) {
	defer p.wg.Done()
	linger := p.Linger
	if linger <= 0 {
		linger = DefaultLinger
	}
	var t *time.Timer
	for {
		f()
		if t == nil {
			t = time.NewTimer(linger)
		} else {
			t.Reset(linger)
		}
		p.idle.Add(1)
		select {
		case f = <-p.work:
			p.idle.Add(-1)
		case <-t.C:
			p.idle.Add(-1)
			return
		case <-p.quit:
			p.idle.Add(-1)
			t.Stop()
			return
		}
	}
}

// Idle returns how many workers wait for a function.
func (p *Pool) Idle() int { return int(p.idle.Load()) }

// Close makes the idle workers exit and waits for every worker, busy ones
// included, to return.
func (p *Pool) Close() {
	p.init()
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
