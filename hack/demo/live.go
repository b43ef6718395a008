package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/hack/workload"
)

// board is the demo's screen: log lines scrolling above a table of the
// three clients, redrawn in place every refreshEvery on a terminal; on
// anything else the log lines, and one line of the table's figures per
// second while a fault is on.
type board struct {
	out   io.Writer
	tty   bool
	cols  int // terminal width; lines are cut to it so the redraw can count them
	start time.Time

	mu     sync.Mutex // guards the fields below
	header string     // what is happening: the fault and its target
	faultT time.Time  // when the fault was injected; zero before it
	victim string
	lanes  map[string]*laneState

	outMu sync.Mutex // guards drawn and the writes to out; never held with mu
	drawn int        // table lines on screen below the log
}

// laneState is one client's figures, fed by its workload's events.
type laneState struct {
	lane *lane
	// recent are the requests that ended in the last second.
	recent []recentReq
	// lastOK is when the last GET succeeded (or the workload started).
	lastOK time.Time
	// longest is the longest time without a successful GET so far in
	// the demo, this lane's earlier faults included.
	longest time.Duration
	serving string
	// downAfter is when, after the fault, the lane counted the victim
	// down; negative until then.
	downAfter time.Duration
	// failedSince counts requests failed since the fault; the first is
	// logged.
	failedSince int
	lists       int
}

type recentReq struct {
	at time.Time
	ok bool
}

const refreshEvery = 250 * time.Millisecond

func newBoard(out *os.File) *board {
	b := &board{out: out, start: time.Now(), cols: 120}
	if _, err := unix.IoctlGetTermios(int(out.Fd()), unix.TCGETS); err == nil && os.Getenv("TERM") != "dumb" {
		b.tty = true
		if ws, err := unix.IoctlGetWinsize(int(out.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 20 {
			b.cols = int(ws.Col)
		}
	}
	return b
}

// log prints a line above the table, stamped with the time since the
// demo started.
func (b *board) log(format string, args ...any) {
	line := fmt.Sprintf("%7.3fs  %s", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
	if !b.tty {
		b.outMu.Lock()
		fmt.Fprintln(b.out, line)
		b.outMu.Unlock()
		return
	}
	b.redraw(line)
}

// redraw clears the table, prints line (if any) and draws the table
// again.
func (b *board) redraw(line string) {
	table := b.table()
	b.outMu.Lock()
	defer b.outMu.Unlock()
	var s strings.Builder
	if b.drawn > 0 {
		fmt.Fprintf(&s, "\x1b[%dA\x1b[J", b.drawn)
	}
	if line != "" {
		s.WriteString(line + "\n")
	}
	for _, l := range table {
		s.WriteString(b.cut(l) + "\n")
	}
	b.drawn = len(table)
	io.WriteString(b.out, s.String())
}

func (b *board) cut(l string) string {
	if r := []rune(l); len(r) >= b.cols {
		return string(r[:b.cols-1])
	}
	return l
}

// endRound takes the table off the screen: the round's clients stopped.
func (b *board) endRound() {
	b.mu.Lock()
	b.lanes, b.faultT = nil, time.Time{}
	b.mu.Unlock()
	if b.tty {
		b.redraw("")
	}
}

// writer returns a writer that logs each line with prefix.
func (b *board) writer(prefix string) io.Writer { return &boardWriter{b: b, prefix: prefix} }

type boardWriter struct {
	b      *board
	prefix string
}

func (w *boardWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.b.log("%s%s", w.prefix, line)
	}
	return len(p), nil
}

// freeze leaves the table on screen as it is: what follows prints below.
func (b *board) freeze() {
	b.outMu.Lock()
	b.drawn = 0
	b.outMu.Unlock()
	b.mu.Lock()
	b.lanes = nil
	b.mu.Unlock()
}

// begin shows the lanes of a new round, with header.
func (b *board) begin(header string) {
	b.mu.Lock()
	b.header, b.faultT, b.victim = header, time.Time{}, ""
	b.lanes = map[string]*laneState{}
	b.mu.Unlock()
}

// setHeader changes the line above the table.
func (b *board) setHeader(header string) {
	b.mu.Lock()
	b.header = header
	b.mu.Unlock()
}

// addLane adds a started lane; longest carries its longest blind time
// over from the earlier rounds.
func (b *board) addLane(l *lane, longest time.Duration) {
	b.mu.Lock()
	b.lanes[l.name] = &laneState{lane: l, lastOK: time.Now(), longest: longest, downAfter: -1}
	b.mu.Unlock()
}

// faulted marks the fault's injection into victim.
func (b *board) faulted(header, victim string) {
	b.mu.Lock()
	b.header, b.faultT, b.victim = header, time.Now(), victim
	for _, ls := range b.lanes {
		ls.failedSince = 0
	}
	b.mu.Unlock()
}

// longest returns a lane's longest blind time so far.
func (b *board) longest(name string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.lanes[name]; ls != nil {
		return max(ls.longest, time.Since(ls.lastOK))
	}
	return 0
}

// downAfter returns when, after the fault, the lane counted the victim
// down (negative: not yet).
func (b *board) downAfter(name string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.lanes[name]; ls != nil {
		return ls.downAfter
	}
	return -1
}

// onEvent is the Config.OnEvent of lane name's workload.
func (b *board) onEvent(name string) func(workload.Event) {
	return func(ev workload.Event) {
		var line string
		b.mu.Lock()
		ls := b.lanes[name]
		if ls == nil {
			b.mu.Unlock()
			return
		}
		switch ev.Kind {
		case workload.KindGet, workload.KindWrite:
			ls.recent = append(ls.recent, recentReq{at: ev.Time, ok: ev.Err == nil})
			if ev.Err == nil && ev.Kind == workload.KindGet {
				ls.longest = max(ls.longest, ev.Time.Sub(ls.lastOK))
				ls.lastOK = ev.Time
			}
			if ev.Err != nil && !b.faultT.IsZero() {
				if ls.failedSince++; ls.failedSince == 1 {
					line = fmt.Sprintf("%-10s first failed request: %s after %s: %s", name, ev.Kind, ev.Latency.Round(time.Millisecond), short(ev.Err))
				}
			}
		case workload.KindServing:
			if ev.Serving != "" && ev.Serving != ls.serving && ls.serving != "" {
				line = fmt.Sprintf("%-10s now on %s", name, ev.Serving)
			}
			if ev.Serving != "" {
				ls.serving = ev.Serving
			}
		case workload.KindList:
			if ls.lists++; ls.lists > 1 {
				line = fmt.Sprintf("%-10s informer relisted (its watch could not resume)", name)
			}
		case workload.KindWatchError:
			line = fmt.Sprintf("%-10s informer's watch ended: %s", name, short(ev.Err))
		}
		b.mu.Unlock()
		if line != "" {
			b.log("%s", line)
		}
	}
}

// run refreshes the table until ctx is done, and polls each lane's health
// view of the victim once the fault is on.
func (b *board) run(ctx context.Context) {
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	lastPlain := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.pollDown()
		if b.tty {
			b.redraw("")
		} else if time.Since(lastPlain) >= time.Second {
			lastPlain = time.Now()
			if line := b.plain(); line != "" {
				b.outMu.Lock()
				fmt.Fprintln(b.out, line)
				b.outMu.Unlock()
			}
		}
	}
}

// pollDown records when each lane first counts the victim down.
func (b *board) pollDown() {
	b.mu.Lock()
	victim, faultT := b.victim, b.faultT
	var todo []*laneState
	for _, ls := range b.lanes {
		if ls.downAfter < 0 {
			todo = append(todo, ls)
		}
	}
	b.mu.Unlock()
	if faultT.IsZero() {
		return
	}
	for _, ls := range todo {
		if !ls.lane.down(victim) { // may read a socket: not under mu
			continue
		}
		after := time.Since(faultT)
		b.mu.Lock()
		ls.downAfter = after
		b.mu.Unlock()
		b.log("%-10s marked %s down, %.2fs after the fault", ls.lane.name, victim, after.Seconds())
	}
}

// row is one lane's figures now.
type row struct {
	name           string
	ok, failed     int
	serving        string
	down           string
	blind, longest time.Duration
}

func (b *board) rows() (header string, faultT time.Time, rows []row) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	for _, name := range laneNames {
		ls := b.lanes[name]
		if ls == nil {
			continue
		}
		keep := ls.recent[:0]
		r := row{name: name, serving: ls.serving, down: "-"}
		for _, q := range ls.recent {
			if now.Sub(q.at) <= time.Second {
				keep = append(keep, q)
				if q.ok {
					r.ok++
				} else {
					r.failed++
				}
			}
		}
		ls.recent = keep
		if ls.downAfter >= 0 {
			r.down = fmt.Sprintf("%.2fs", ls.downAfter.Seconds())
		}
		r.blind = now.Sub(ls.lastOK)
		r.longest = max(ls.longest, r.blind)
		rows = append(rows, r)
	}
	return b.header, b.faultT, rows
}

// table renders the lines below the log.
func (b *board) table() []string {
	header, faultT, rows := b.rows()
	if rows == nil {
		return nil
	}
	if !faultT.IsZero() {
		header += fmt.Sprintf("  [%.1fs ago]", time.Since(faultT).Seconds())
	}
	lines := []string{"", header,
		fmt.Sprintf("  %-11s %6s %9s  %-17s %12s %10s %14s", "client", "ok/s", "failed/s", "apiserver now", "marked down", "blind now", "longest blind")}
	for _, r := range rows {
		lines = append(lines, fmt.Sprintf("  %-11s %6d %9d  %-17s %12s %9.1fs %13.1fs", r.name, r.ok, r.failed, orDash(r.serving), r.down, r.blind.Seconds(), r.longest.Seconds()))
	}
	return append(lines, "")
}

// plain is the table's figures on one line, for output that is not a
// terminal; "" before the fault.
func (b *board) plain() string {
	_, faultT, rows := b.rows()
	if faultT.IsZero() || len(rows) == 0 {
		return ""
	}
	parts := []string{fmt.Sprintf("%7.3fs  +%4.1fs", time.Since(b.start).Seconds(), time.Since(faultT).Seconds())}
	for _, r := range rows {
		parts = append(parts, fmt.Sprintf("%s %d ok %d failed on %s blind %.1fs", r.name, r.ok, r.failed, orDash(r.serving), r.blind.Seconds()))
	}
	return strings.Join(parts, " | ")
}

func short(err error) string {
	s := err.Error()
	if len(s) > 110 {
		s = s[:110] + "..."
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
