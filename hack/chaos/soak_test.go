package chaos_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/chaos"
	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

func TestMain(m *testing.M) { bedtest.Main(m, nil) }

// TestSoak is make test's chaos run: 2 minutes (APIFAILOVER_CHAOS_DURATION
// to change), a seed from SEED or the clock, logged with the command that
// replays it. Every invariant must hold.
func TestSoak(t *testing.T) {
	if !bedtest.Strict() {
		t.Skip("a soak on the test bed: set APIFAILOVER_E2E=1")
	}
	d := 2 * time.Minute
	if v := os.Getenv("APIFAILOVER_CHAOS_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("APIFAILOVER_CHAOS_DURATION=%q: %v", v, err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SEED=%q: %v", v, err)
		}
	}
	out := filepath.Join(outDir(t), "chaos")
	t.Logf("seed %d (replay: make chaos SEED=%d DURATION=%s); results in %s", seed, seed, d, out)
	s, err := chaos.Run(t.Context(), chaos.Options{Seed: seed, Duration: d, Out: out, Log: t.Output(),
		Bed: testbed.Options{InstallDeps: os.Geteuid() == 0, Log: t.Output()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations, success %.5f, failures %v", s.Operations, s.SuccessRatio, s.Failures)
}

// outDir is the repository's _output, where make chaos writes too.
func outDir(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "_output")
}
