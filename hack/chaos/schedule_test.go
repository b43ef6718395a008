package chaos

import (
	"slices"
	"testing"
	"time"
)

func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	a := Plan(42, 10*time.Minute, 3)
	b := Plan(42, 10*time.Minute, 3)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different plans:\n%s\n%s", FormatPlan(a), FormatPlan(b))
	}
	if c := Plan(43, 10*time.Minute, 3); slices.Equal(a, c) {
		t.Errorf("seeds 42 and 43 gave the same plan:\n%s", FormatPlan(a))
	}
}

// Every plan keeps its bounds: faults one at a time within the soak,
// after the warm-up and before the cool-down, on a real server, exactly
// one phase with every server down, and (over a long soak) every kind.
func TestPlanBounds(t *testing.T) {
	for seed := range uint64(200) {
		for _, d := range []time.Duration{2 * time.Minute, 10 * time.Minute} {
			steps := Plan(seed, d, 3)
			if len(steps) == 0 {
				t.Fatalf("seed %d, %v: no step", seed, d)
			}
			allDown := 0
			for i, s := range steps {
				if s.At < warmup || s.End() > d-cooldown {
					t.Errorf("seed %d, %v: step %v outside [%v, %v]", seed, d, s, warmup, d-cooldown)
				}
				if i > 0 && s.At < steps[i-1].End()+minGap {
					t.Errorf("seed %d, %v: step %v overlaps or follows %v too closely", seed, d, s, steps[i-1])
				}
				switch {
				case s.Kind == AllDown:
					allDown++
					if s.Server != -1 {
						t.Errorf("seed %d: all-down on server %d", seed, s.Server)
					}
				case s.Server < 0 || s.Server > 2:
					t.Errorf("seed %d: step %v on no server", seed, s)
				}
			}
			if allDown != 1 {
				t.Errorf("seed %d, %v: %d all-down phases, want 1:\n%s", seed, d, allDown, FormatPlan(steps))
			}
		}
	}
	seen := map[Kind]bool{}
	for _, s := range Plan(1, 10*time.Minute, 3) {
		seen[s.Kind] = true
	}
	for _, k := range append(slices.Clone(kinds), AllDown) {
		if !seen[k] {
			t.Errorf("a 10-minute plan has no %s fault", k)
		}
	}
}

func TestPlanTooShort(t *testing.T) {
	if steps := Plan(1, 10*time.Second, 3); len(steps) != 0 {
		t.Errorf("a 10s soak got steps:\n%s", FormatPlan(steps))
	}
}
