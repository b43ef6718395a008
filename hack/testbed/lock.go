package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockName is the machine-wide lock file (in os.TempDir) that keeps beds
// from running at the same time: `go test ./hack/...` runs test binaries
// in parallel, and two control planes on a small machine blow each
// other's timing budgets. The network namespaces would keep them apart;
// the CPUs do not.
const lockName = "apifailover-testbed.lock"

// lockPoll is how often a waiting Start tries the lock again.
const lockPoll = 200 * time.Millisecond

// acquireLock takes the machine-wide bed lock, waiting for it until ctx
// ends. Close releases it (closing the file releases the flock).
func acquireLock(ctx context.Context, logf func(string, ...any)) (*os.File, error) {
	path := filepath.Join(os.TempDir(), lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("testbed: lock: %w", err)
	}
	t := time.NewTicker(lockPoll)
	defer t.Stop()
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("testbed: lock %s: %w", path, err)
		}
		if !waiting {
			logf("another test bed is running; waiting for it to close (lock %s)", path)
			waiting = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("testbed: waiting for another test bed to close (lock %s): %w", path, context.Cause(ctx))
		case <-t.C:
		}
	}
}
