// Command run is make chaos: a seeded soak of random faults on a local
// control plane under load (package chaos). DURATION and SEED (or -duration
// and -seed) choose the soak; the same seed and duration replay the same
// schedule.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/apifailover/apifailover/hack/chaos"
	"github.com/apifailover/apifailover/hack/testbed"
)

func main() {
	os.Exit(run())
}

func run() int {
	duration := flag.Duration("duration", 10*time.Minute, "how long the soak runs, at least 1m (env DURATION)")
	seed := flag.Uint64("seed", 0, "seed of the fault schedule; 0 picks one from the clock (env SEED)")
	out := flag.String("out", "_output/chaos", "directory of summary.json and the logs")
	flag.Parse()
	if err := fromEnv(duration, seed); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	if *duration < time.Minute {
		fmt.Fprintf(os.Stderr, "chaos: duration %s: want at least 1m\n", *duration)
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	// Build and install what the bed needs while the network is
	// reachable, then enter a private network namespace.
	if !testbed.InNetns() {
		if err := testbed.Prepare(context.Background(), testbed.Options{InstallDeps: os.Geteuid() == 0, Log: os.Stderr}); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
	}
	if err := testbed.ReexecInNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := chaos.Run(ctx, chaos.Options{Seed: *seed, Duration: *duration, Out: *out, Log: os.Stdout,
		Bed: testbed.Options{InstallDeps: os.Geteuid() == 0}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("chaos: every invariant held; %s/summary.json, %s/timeline.svg (replay: %s)\n", *out, *out, s.Replay)
	return 0
}

// fromEnv takes DURATION and SEED where the flags were not given.
func fromEnv(duration *time.Duration, seed *uint64) error {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if v := os.Getenv("DURATION"); v != "" && !set["duration"] {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("DURATION=%q: want a Go duration such as 10m", v)
		}
		*duration = d
	}
	if v := os.Getenv("SEED"); v != "" && !set["seed"] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("SEED=%q: want a whole number 0-%d", v, uint64(1<<64-1))
		}
		*seed = n
	}
	return nil
}
