package workload

import (
	"slices"
	"strconv"
	"time"
)

// Kind says what an Event records.
type Kind uint8

const (
	// KindGet: a GET of the workload's namespace finished (Err says how).
	KindGet Kind = iota + 1
	// KindWrite: a ConfigMap create finished (Err says how).
	KindWrite
	// KindSeen: the informer saw a ConfigMap for the first time.
	KindSeen
	// KindList: the informer started listing: a LIST or a watch with
	// sendInitialEvents=true (client-go's WatchListClient, on by default
	// since v1.35), after a watch or as its first request. Further list
	// requests before the next watch (a watch-list falling back to a
	// LIST, a failed list retried) belong to the same list. Every list
	// after the first is a relist.
	KindList
	// KindWatch: the informer sent a watch request that resumes from a
	// resource version (no relist).
	KindWatch
	// KindWatchError: the informer's reflector reported a list or watch
	// error (cache.WatchErrorHandler).
	KindWatchError
	// KindServing: the apiserver reported by Config.Serving changed.
	KindServing
)

// String returns the lowercase kind name.
func (k Kind) String() string {
	switch k {
	case KindGet:
		return "get"
	case KindWrite:
		return "write"
	case KindSeen:
		return "seen"
	case KindList:
		return "list"
	case KindWatch:
		return "watch"
	case KindWatchError:
		return "watch-error"
	case KindServing:
		return "serving"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one entry of the timeline.
type Event struct {
	// Time is when it happened (for requests: when the answer came).
	Time time.Time
	Kind Kind
	// Seq is the writer's sequence number (KindWrite, KindSeen), 0 if none.
	Seq int
	// Name is the ConfigMap name (KindWrite on success or with a fixed
	// name, KindSeen).
	Name string
	// Latency is how long the request took (KindGet, KindWrite).
	Latency time.Duration
	// Serving is the apiserver reported by Config.Serving at Time
	// (KindServing: the new one; "" if unknown).
	Serving string
	// Endpoint is the address the request was sent to (KindGet,
	// KindWrite, KindList, KindWatch), when known (see Request.Endpoint).
	Endpoint string
	// Err is the failure (KindGet, KindWrite, KindList, KindWatch,
	// KindWatchError), nil on success.
	Err error
}

// Request is one GET or create.
type Request struct {
	// Seq numbers creates 1, 2, ...; 0 for GETs.
	Seq int
	// Name is the ConfigMap name: Prefix-Seq, or the server-generated
	// name of a successful GenerateName create. Empty for GETs.
	Name       string
	Start, End time.Time
	// Serving is Config.Serving's answer when the request ended.
	Serving string
	// Endpoint is the remote address of the connection the request was
	// last sent on, as reported through httptrace's GotConn ("" if the
	// client does not report it). With transport.Wrap it is the apiserver
	// that answered; through a local proxy, the proxy.
	Endpoint string
	// Attempts is how often the request was sent (client-go's retries,
	// Config.GetRetries, make it more than 1); 0 if it was not counted.
	Attempts int
	// Err is nil on success.
	Err error
}

// OK reports whether the request succeeded.
func (r Request) OK() bool { return r.Err == nil }

// Sighting is the informer's first sight of a ConfigMap.
type Sighting struct {
	Name string
	// Seq is the object's workload sequence label (SeqLabel), 0 if absent.
	Seq  int
	Time time.Time
}

// Results is what a workload recorded. Slices are in completion order.
type Results struct {
	// Synced is when the informer finished its initial list.
	Synced time.Time
	// Gets and Writes are every finished GET and create.
	Gets, Writes []Request
	// SkippedGets counts GET ticks dropped because MaxInFlightGets GETs
	// were still running (a stalled client).
	SkippedGets int
	// Seen holds every ConfigMap the informer saw, first sight only.
	Seen []Sighting
	// Lists counts the informer's lists (see KindList), the initial one
	// included; Watches its resuming watch requests.
	Lists, Watches int
	// WatchErrors counts reflector errors (see KindWatchError).
	WatchErrors int
	// Timeline holds every event, oldest first.
	Timeline []Event
}

// Relists is the number of lists after the initial one.
func (r *Results) Relists() int { return max(r.Lists-1, 0) }

// FailedGets counts GETs that failed.
func (r *Results) FailedGets() int { return countFailed(r.Gets) }

// FailedWrites counts creates that failed. A failed create may or may not
// have created its object (the request may have been processed before the
// connection broke).
func (r *Results) FailedWrites() int { return countFailed(r.Writes) }

func countFailed(rs []Request) int {
	n := 0
	for _, r := range rs {
		if !r.OK() {
			n++
		}
	}
	return n
}

// Created returns the names of the successfully created ConfigMaps.
func (r *Results) Created() []string {
	var out []string
	for _, w := range r.Writes {
		if w.OK() {
			out = append(out, w.Name)
		}
	}
	return out
}

// Lost returns the successfully created ConfigMaps the informer never saw.
func (r *Results) Lost() []string {
	seen := make(map[string]bool, len(r.Seen))
	for _, s := range r.Seen {
		seen[s.Name] = true
	}
	var lost []string
	for _, name := range r.Created() {
		if !seen[name] {
			lost = append(lost, name)
		}
	}
	return lost
}

// Duplicates returns the sequence numbers for which the informer saw more
// than one object: one logical create that produced several objects
// (possible with GenerateName when a create is sent twice).
func (r *Results) Duplicates() []int {
	count := make(map[int]int)
	for _, s := range r.Seen {
		if s.Seq > 0 {
			count[s.Seq]++
		}
	}
	var dups []int
	for seq, n := range count {
		if n > 1 {
			dups = append(dups, seq)
		}
	}
	slices.Sort(dups)
	return dups
}

// FirstGetOK returns when the first GET sent at or after t succeeded.
func (r *Results) FirstGetOK(t time.Time) (time.Time, bool) {
	return firstOK(r.Gets, t)
}

// FirstWriteOK returns when the first create sent at or after t succeeded.
func (r *Results) FirstWriteOK(t time.Time) (time.Time, bool) {
	return firstOK(r.Writes, t)
}

func firstOK(rs []Request, t time.Time) (time.Time, bool) {
	var first time.Time
	for _, q := range rs {
		if q.OK() && !q.Start.Before(t) && (first.IsZero() || q.End.Before(first)) {
			first = q.End
		}
	}
	return first, !first.IsZero()
}

// FirstSeenWrite returns when the informer first saw an object whose
// create was sent at or after t: the informer is delivering fresh writes
// again.
func (r *Results) FirstSeenWrite(t time.Time) (time.Time, bool) {
	fresh := make(map[string]bool)
	for _, w := range r.Writes {
		if w.OK() && !w.Start.Before(t) {
			fresh[w.Name] = true
		}
	}
	var first time.Time
	for _, s := range r.Seen {
		if fresh[s.Name] && (first.IsZero() || s.Time.Before(first)) {
			first = s.Time
		}
	}
	return first, !first.IsZero()
}

// ListsSince counts lists (KindList) started at or after t.
func (r *Results) ListsSince(t time.Time) int {
	n := 0
	for _, e := range r.Timeline {
		if e.Kind == KindList && !e.Time.Before(t) {
			n++
		}
	}
	return n
}

// LongestGetGap returns the longest time within [from, to] without a
// successful GET completing: how long the client was blind.
func (r *Results) LongestGetGap(from, to time.Time) time.Duration {
	var ends []time.Time
	for _, g := range r.Gets {
		if g.OK() && !g.End.Before(from) && !g.End.After(to) {
			ends = append(ends, g.End)
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	prev, gap := from, time.Duration(0)
	for _, e := range ends {
		gap = max(gap, e.Sub(prev))
		prev = e
	}
	return max(gap, to.Sub(prev))
}
