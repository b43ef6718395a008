package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Kind is a fault the soak injects.
type Kind string

// The faults of a schedule. Each hits one apiserver, but AllDown.
const (
	Kill      Kind = "kill"      // SIGKILL, restarted at the end
	Hang      Kind = "hang"      // SIGSTOP, SIGCONT at the end
	Blackhole Kind = "blackhole" // iptables DROP both ways
	Reject    Kind = "reject"    // iptables REJECT with a reset
	Graceful  Kind = "graceful"  // SIGTERM (graceful shutdown), restarted at the end
	Slow      Kind = "slow"      // a latency shim in front of new connections
	Lossy     Kind = "lossy"     // 20% of packets dropped both ways
	AllDown   Kind = "all-down"  // every apiserver SIGKILLed, restarted at the end
)

// kinds are the single-server faults a schedule draws from.
var kinds = []Kind{Kill, Hang, Blackhole, Reject, Graceful, Slow, Lossy}

// Step is one fault of a schedule: from At (since the soak began) for
// For, on apiserver Server (an index; -1 for every one, with AllDown).
type Step struct {
	At     time.Duration `json:"at"`
	For    time.Duration `json:"for"`
	Kind   Kind          `json:"kind"`
	Server int           `json:"server"`
}

// End is when the step's fault is lifted.
func (s Step) End() time.Duration { return s.At + s.For }

func (s Step) String() string {
	target := fmt.Sprintf("apiserver-%d", s.Server+1)
	if s.Server < 0 {
		target = "every apiserver"
	}
	return fmt.Sprintf("%7.1fs  %-9s %-15s for %.1fs", s.At.Seconds(), s.Kind, target, s.For.Seconds())
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
)

// Plan returns the fault schedule of a soak of duration d against servers
// apiservers: a pure function of seed, d and servers. Faults come one at a
// time (never more than one of three servers down), with gaps between
// them, and one phase with every server down about halfway through. A
// duration too short for anything but the warm-up and cool-down gives no
// step.
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
	for {
		if !placedAllDown && t >= allDownAt && t+allDownFor <= last {
			steps = append(steps, Step{At: t, For: allDownFor, Kind: AllDown, Server: -1})
			placedAllDown = true
			t += allDownFor + between(minGap, maxGap)
			continue
		}
		f := between(minFault, maxFault)
		if t+f > last {
			break
		}
		steps = append(steps, Step{At: t, For: f, Kind: kinds[r.IntN(len(kinds))], Server: r.IntN(servers)})
		t += f + between(minGap, maxGap)
	}
	if !placedAllDown && allDownAt+allDownFor <= last && len(steps) > 0 {
		// The draws went past the middle: put it after the last fault.
		if at := steps[len(steps)-1].End() + minGap; at+allDownFor <= last {
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
