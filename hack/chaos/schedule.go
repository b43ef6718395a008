package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// Kind is a fault the soak injects.
type Kind string

// The faults of a schedule. Each hits one of the permanent apiservers,
// but AllDown (every one), Join (a server of its own) and Handover (the
// soak's localproxy).
const (
	Kill      Kind = "kill"      // SIGKILL, restarted at the end
	Hang      Kind = "hang"      // SIGSTOP, SIGCONT at the end
	Blackhole Kind = "blackhole" // iptables DROP both ways
	Reject    Kind = "reject"    // iptables REJECT with a reset
	Graceful  Kind = "graceful"  // SIGTERM (graceful shutdown), restarted at the end
	Slow      Kind = "slow"      // a latency shim in front of new connections
	Lossy     Kind = "lossy"     // 20% of packets dropped both ways
	AllDown   Kind = "all-down"  // every apiserver SIGKILLed, restarted at the end
	// MisnamedCert restarts the apiserver with a serving certificate from
	// the cluster's CA for another name, and with the good one at the end.
	MisnamedCert Kind = "misnamed-cert"
	// NotYetValidCert restarts the apiserver with a serving certificate
	// that becomes valid only after the window, and with the good one at
	// the end.
	NotYetValidCert Kind = "not-yet-valid-cert"
	// Join starts one more apiserver (it lists itself in the kubernetes
	// EndpointSlice) and stops it gracefully at the end (it leaves the
	// slice): the clients must take it up and let it go.
	Join Kind = "join"
	// Handover replaces the soak's localproxy by a new instance on the
	// same addresses, as a DaemonSet rollout does: both serve for the
	// window, then the old one hands over and drains.
	Handover Kind = "handover"
)

// draws are what a schedule draws from, one entry each: a fault kind, or
// kinds of which one is drawn next (the two certificate faults). Join
// comes last: once a plan has maxJoins, the draw is from the others.
var draws = [][]Kind{{Kill}, {Hang}, {Blackhole}, {Reject}, {Graceful}, {Slow}, {Lossy},
	{MisnamedCert, NotYetValidCert}, {Handover}, {Join}}

// kinds are every fault a schedule draws, AllDown aside.
var kinds = slices.Concat(draws...)

// serverDown reports whether a fault of kind k takes its apiserver out of
// service (for "at most all-but-one down"): every kind with a permanent
// apiserver as its target. A joined apiserver does not count, nor does
// the localproxy.
func (k Kind) serverDown() bool { return k != Join && k != Handover && k != AllDown }

// hold is the range of a step's For for kind k, and settle how long its
// lifting is expected to take beyond For (restarts, a drain): the plan
// keeps its gaps after that. A certificate fault's For includes the
// restart into the bad certificate, a join's the new server's start
// (both about 8s on a loaded 2-core machine), so that the bad certificate
// is served, and the joined server used, for 3 to 8s; a hand-over's For
// is the time both instances serve, and the old one then drains for up to
// localproxy.DefaultShutdownTimeout (10s).
func (k Kind) hold() (lo, hi, settle time.Duration) {
	switch k {
	case MisnamedCert, NotYetValidCert:
		return minFault + restartTime, maxFault + restartTime, restartTime
	case Join:
		return minFault + restartTime, maxFault + restartTime, restartTime
	case Handover:
		return minFault, maxFault, handoverDrain
	}
	return minFault, maxFault, 0
}

// Step is one fault of a schedule: from At (since the soak began) for
// For, on apiserver Server (an index; -1 for every one, with AllDown).
type Step struct {
	At     time.Duration `json:"at"`
	For    time.Duration `json:"for"`
	Kind   Kind          `json:"kind"`
	Server int           `json:"server"`
}

// End is when the step's fault begins to be lifted.
func (s Step) End() time.Duration { return s.At + s.For }

// Settled is when the step's fault is expected to be gone: End and the
// time its lifting takes (restarts, a drain; see Kind.hold).
func (s Step) Settled() time.Duration {
	_, _, settle := s.Kind.hold()
	return s.End() + settle
}

func (s Step) String() string {
	return fmt.Sprintf("%7.1fs  %-18s %-20s for %.1fs", s.At.Seconds(), s.Kind, s.target(), s.For.Seconds())
}

// target names what the step hits.
func (s Step) target() string {
	switch {
	case s.Kind == Join:
		return "a new apiserver"
	case s.Kind == Handover:
		return "localproxy"
	case s.Server < 0:
		return "every apiserver"
	}
	return fmt.Sprintf("apiserver-%d", s.Server+1)
}

// Schedule bounds.
const (
	// warmup lets the clients settle before the first fault, and cooldown
	// after the last one before the invariants are checked.
	warmup   = 5 * time.Second
	cooldown = 10 * time.Second
	minFault = 3 * time.Second
	maxFault = 8 * time.Second
	minGap   = 3 * time.Second
	maxGap   = 6 * time.Second
	// allDownFor is the one phase with every apiserver down.
	allDownFor = 5 * time.Second
	// restartTime is what an apiserver's graceful restart (shutdown delay,
	// exit, start, listed in the EndpointSlice) or a join takes here.
	restartTime = 8 * time.Second
	// handoverDrain is how long a replaced localproxy takes to stop: it
	// waits for its successor's /readyz and drains its connections for up
	// to localproxy.DefaultShutdownTimeout.
	handoverDrain = 12 * time.Second
)

// maxJoins bounds the joins of a soak against servers permanent
// apiservers: the bed never reuses an address and has testbed.MaxAPIServers.
func maxJoins(servers int) int { return testbed.MaxAPIServers - servers }

// Plan returns the fault schedule of a soak of duration d against servers
// apiservers: a pure function of seed, d and servers. Faults come one at a
// time (never more than one of the permanent servers down; a joined one
// is not counted), each with a gap after it has settled, and one phase
// with every server down about halfway through. Joins are at most
// maxJoins(servers). A duration too short for anything but the warm-up
// and cool-down gives no step.
func Plan(seed uint64, d time.Duration, servers int) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
	}
	last := d - cooldown
	allDownAt := d / 2
	var steps []Step
	t := warmup
	placedAllDown := false
	joins := 0
	for {
		if !placedAllDown && t >= allDownAt && t+allDownFor <= last {
			steps = append(steps, Step{At: t, For: allDownFor, Kind: AllDown, Server: -1})
			placedAllDown = true
			t += allDownFor + between(minGap, maxGap)
			continue
		}
		g := draws[r.IntN(len(draws))]
		if g[0] == Join && joins >= maxJoins(servers) {
			g = draws[r.IntN(len(draws)-1)]
		}
		st := Step{At: t, Kind: g[r.IntN(len(g))], Server: -1}
		lo, hi, _ := st.Kind.hold()
		st.For = between(lo, hi)
		if st.Settled() > last {
			break
		}
		if st.Kind.serverDown() {
			st.Server = r.IntN(servers)
		}
		if st.Kind == Join {
			joins++
		}
		steps = append(steps, st)
		t = st.Settled() + between(minGap, maxGap)
	}
	if !placedAllDown && allDownAt+allDownFor <= last && len(steps) > 0 {
		// The draws went past the middle: put it after the last fault.
		if at := steps[len(steps)-1].Settled() + minGap; at+allDownFor <= last {
			steps = append(steps, Step{At: at, For: allDownFor, Kind: AllDown, Server: -1})
		}
	}
	return steps
}

// FormatPlan prints a schedule one step per line.
func FormatPlan(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}
