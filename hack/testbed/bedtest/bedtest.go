// Package bedtest is what tests on the test bed share: entering the private
// network namespace in TestMain, and starting a bed that skips (outside CI
// and e2e runs) or fails (in them) when the machine is not prepared.
package bedtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// netnsErr is why the process could not enter a private network namespace.
var netnsErr error

// Main runs the tests of a package inside a private network namespace
// (testbed.ReexecInNetns). after, if set, runs after the tests with their
// exit code and returns the one to exit with.
func Main(m *testing.M, after func(code int) int) {
	if Strict() && os.Geteuid() == 0 && !testbed.InNetns() {
		// Install and build now, while the network is reachable: the
		// tests run in a private network namespace.
		if err := testbed.Prepare(context.Background(), testbed.Options{InstallDeps: true, Log: os.Stderr}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := testbed.ReexecInNetns(); err != nil {
		if Strict() {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		netnsErr = err
	}
	code := m.Run()
	if after != nil {
		code = after(code)
	}
	os.Exit(code)
}

// Strict is true in CI and e2e runs (CI=true or APIFAILOVER_E2E=1):
// missing prerequisites fail, never skip.
func Strict() bool {
	return os.Getenv("CI") == "true" || os.Getenv("APIFAILOVER_E2E") == "1"
}

// Netns skips t, or fails it in strict runs, when the tests do not run
// in a private network namespace (Main could not make one).
func Netns(t *testing.T) {
	t.Helper()
	if netnsErr == nil && testbed.InNetns() {
		return
	}
	err := netnsErr
	if err == nil {
		err = errors.New("the package's TestMain is not bedtest.Main")
	}
	if Strict() {
		t.Fatalf("no private network namespace: %v", err)
	}
	t.Skipf("no private network namespace (set APIFAILOVER_E2E=1 to fail instead): %v", err)
}

// Start starts a bed and closes it when the test ends. Outside strict runs
// it skips when the machine is not prepared; in them, as root, it installs
// and builds what is missing. Opts.Dir defaults to APIFAILOVER_TESTBED_DIR
// (kept for inspection) or a temporary directory, opts.Version to
// KUBE_VERSION (then testbed.DefaultVersion), opts.Log to the test's output.
func Start(t *testing.T, ctx context.Context, opts testbed.Options) *testbed.Bed {
	t.Helper()
	if netnsErr != nil {
		t.Skipf("no private network namespace (set APIFAILOVER_E2E=1 to fail instead): %v", netnsErr)
	}
	if !Strict() {
		if err := testbed.CheckPrerequisites(opts); err != nil {
			t.Skipf("prerequisites missing (set APIFAILOVER_E2E=1 to install/build and fail instead):\n%v", err)
		}
	}
	opts.InstallDeps = Strict() && os.Geteuid() == 0
	if opts.Version == "" {
		// make compat runs the suite against other builds this way; the
		// Makefile exports the default.
		opts.Version = os.Getenv("KUBE_VERSION")
	}
	if opts.Dir == "" {
		opts.Dir = os.Getenv("APIFAILOVER_TESTBED_DIR")
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Log == nil {
		opts.Log = t.Output()
	}
	began := time.Now()
	bed, err := testbed.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("bed with %d apiservers (kube-apiserver %s) up in %s", len(bed.APIServers()), cmp.Or(opts.Version, testbed.DefaultVersion), time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return bed
}
