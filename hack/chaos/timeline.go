package chaos

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/plots"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport/upstream"
)

// The soak's client paths, in the timeline's order.
const (
	pathTransport  = "transport"
	pathLocalProxy = "localproxy"
)

// Timeline is the soak over time, in seconds since the load started (the
// schedule's time zero): what timeline.svg draws.
type Timeline struct {
	// Faults as they happened: from injection until lifted.
	Faults []FaultWindow `json:"faults"`
	// PerSecond counts the requests (GETs and creates) of every path that
	// ended in each second.
	PerSecond map[string]Counts `json:"per_second"`
	// Events are the paths' health events: an apiserver counted down or
	// up, a new preferred apiserver (a failover, or the move back).
	Events []PathEvent `json:"events"`
	// EventsDropped counts events past maxEvents, not recorded.
	EventsDropped int `json:"events_dropped,omitempty"`
}

// FaultWindow is one fault of the schedule as it happened.
type FaultWindow struct {
	Kind Kind `json:"kind"`
	// Server is the apiserver's index; -1 for every one (AllDown).
	Server int     `json:"server"`
	From   float64 `json:"from_s"`
	To     float64 `json:"to_s"`
}

// Counts are requests per second: OK[i] and Failed[i] ended in second i.
type Counts struct {
	OK     []int `json:"ok"`
	Failed []int `json:"failed"`
}

// PathEvent is a pool event of one path.
type PathEvent struct {
	At   float64 `json:"at_s"`
	Path string  `json:"path"`
	// Kind is "down", "up" or "preferred".
	Kind string `json:"kind"`
	// Server is the apiserver's index, -1 if it is none of the bed's;
	// Addr its address.
	Server int    `json:"server"`
	Addr   string `json:"addr"`
}

// maxEvents bounds the events recorded: a lossy apiserver may flap.
const maxEvents = 10000

// eventLog records the paths' pool events with their time.
type eventLog struct {
	mu      sync.Mutex // guards the fields below
	events  []timedEvent
	dropped int
}

type timedEvent struct {
	at   time.Time
	path string
	ev   upstream.Event
}

// recorder returns a pool subscriber that records path's down, up and
// preferred events.
func (l *eventLog) recorder(path string) func(upstream.Event) {
	return func(ev upstream.Event) {
		switch ev.Kind {
		case upstream.EventDown, upstream.EventUp, upstream.EventPreferred:
		default:
			return
		}
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.events) >= maxEvents {
			l.dropped++
			return
		}
		l.events = append(l.events, timedEvent{at: now, path: path, ev: ev})
	}
}

// timeline turns the soak's record into a Timeline.
func (r *run) timeline(results map[string]workload.Results, windows []window) Timeline {
	secs := func(t time.Time) float64 { return math.Round(t.Sub(r.began).Seconds()*1000) / 1000 }
	t := Timeline{PerSecond: map[string]Counts{}}
	for _, w := range windows {
		t.Faults = append(t.Faults, FaultWindow{Kind: w.kind, Server: w.server, From: secs(w.start), To: secs(w.end)})
	}
	n := int(math.Ceil(r.opts.Duration.Seconds()))
	for name, res := range results {
		path := name[:strings.IndexByte(name, '-')]
		c := t.PerSecond[path]
		for _, rq := range slices.Concat(res.Gets, res.Writes) {
			i := int(rq.End.Sub(r.began) / time.Second)
			if i < 0 {
				continue
			}
			for len(c.OK) < max(n, i+1) {
				c.OK, c.Failed = append(c.OK, 0), append(c.Failed, 0)
			}
			if rq.OK() {
				c.OK[i]++
			} else {
				c.Failed[i]++
			}
		}
		t.PerSecond[path] = c
	}
	index := map[string]int{}
	for i, s := range r.bed.APIServers() {
		index[s.Addr()] = i
	}
	r.faults.mu.Lock()
	for _, s := range r.faults.joined {
		index[s.Addr()] = s.Index() - 1
	}
	r.faults.mu.Unlock()
	r.events.mu.Lock()
	defer r.events.mu.Unlock()
	for _, e := range r.events.events {
		if e.ev.Addr == "" {
			continue
		}
		server, ok := index[e.ev.Addr]
		if !ok {
			server = -1
		}
		t.Events = append(t.Events, PathEvent{At: secs(e.at), Path: e.path, Kind: e.ev.Kind.String(), Server: server, Addr: e.ev.Addr})
	}
	t.EventsDropped = r.events.dropped
	return t
}

// WriteTimeline draws s's timeline into path (.svg or .png): a panel per
// path with its requests answered and failed per second, the faults as
// bands labelled with their kind and apiserver, and the path's health
// events as marks (down, up, preferred changed) labelled with the
// apiserver's number.
func WriteTimeline(s *Summary, path string) error {
	tl := plots.Timeline{
		Title: fmt.Sprintf("chaos soak, seed %d, %s: %d faults; success (all-down phase excluded) %s",
			s.Seed, time.Duration(s.Duration*float64(time.Second)), len(s.Timeline.Faults), successLine(s)),
		XLabel:        "seconds since the load started",
		Bin:           1,
		From:          0,
		To:            s.Duration,
		ScalePerPanel: true, // kubectl's 1 request/s below the workloads' 90
	}
	for _, f := range s.Timeline.Faults {
		tl.Bands = append(tl.Bands, plots.Band{From: f.From, To: f.To, Kind: colourGroup(f.Kind), Label: string(f.Kind) + " " + faultTarget(f.Kind, f.Server)})
	}
	paths := make([]string, 0, len(s.Timeline.PerSecond))
	for p := range s.Timeline.PerSecond {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int { return pathRank(a) - pathRank(b) })
	for _, p := range paths {
		c := s.Timeline.PerSecond[p]
		pn := plots.Panel{Title: p + " (" + pathWhat(p) + ")", OK: floats(c.OK), Failed: floats(c.Failed)}
		for _, e := range s.Timeline.Events {
			if e.Path != p {
				continue
			}
			m := plots.Mark{At: e.At, Label: serverNumber(e.Server, e.Addr)}
			switch e.Kind {
			case "down":
				m.Kind = plots.MarkDown
			case "up":
				m.Kind = plots.MarkUp
			case "preferred":
				m.Kind = plots.MarkFailover
			default:
				continue
			}
			pn.Marks = append(pn.Marks, m)
		}
		tl.Panels = append(tl.Panels, pn)
	}
	if len(tl.Panels) == 0 {
		return fmt.Errorf("chaos: timeline %s: no request recorded", path)
	}
	return tl.Save(path)
}

func successLine(s *Summary) string {
	var parts []string
	for _, p := range []string{pathTransport, pathLocalProxy, pathKubectl} {
		if v, ok := s.SuccessByPath[p]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f%%", p, v*100))
		}
	}
	return strings.Join(parts, ", ")
}

func pathRank(p string) int {
	switch p {
	case pathTransport:
		return 0
	case pathLocalProxy:
		return 1
	case pathKubectl:
		return 2
	}
	return 3
}

func pathWhat(p string) string {
	switch p {
	case pathTransport:
		return "transport.Wrap, 2 workloads and 10 CRUD workers"
	case pathLocalProxy:
		return "localproxy, 2 workloads and 10 CRUD workers"
	case pathKubectl:
		return "kubectl get through localproxy, once a second"
	}
	return p
}

// faultTarget names what a fault hit: an apiserver (a joined one too),
// every one, or localproxy.
func faultTarget(k Kind, server int) string {
	switch {
	case k == Handover:
		return "localproxy"
	case k == Join && server < 0:
		return "a new apiserver"
	}
	return serverName(server)
}

// colourGroup is the colour of a fault's band: one per group of kinds,
// since the bands have eight colours (hack/plots) and the schedule twelve
// kinds; the label tells the kinds of a group apart.
func colourGroup(k Kind) string {
	switch k {
	case Kill, Graceful:
		return "stopped"
	case Blackhole, Reject, Lossy:
		return "network"
	case MisnamedCert, NotYetValidCert:
		return "certificate"
	}
	return string(k) // hang, slow, all-down, join, handover
}

func serverName(i int) string {
	if i < 0 {
		return "every apiserver"
	}
	return fmt.Sprintf("apiserver-%d", i+1)
}

// serverNumber labels a mark: the apiserver's number, or its address.
func serverNumber(i int, addr string) string {
	if i < 0 {
		return addr
	}
	return fmt.Sprint(i + 1)
}

func floats(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
