package testbed

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// pollInterval is how often readiness conditions are checked.
const pollInterval = 100 * time.Millisecond

// errStopPolling wraps a condition error that makes waiting pointless (for
// example: the process being waited for has exited).
type errStopPolling struct{ err error }

func (e errStopPolling) Error() string { return e.err.Error() }
func (e errStopPolling) Unwrap() error { return e.err }

// stopPolling makes poll return err at once.
func stopPolling(err error) error { return errStopPolling{err} }

// poll calls cond every pollInterval until it returns true, ctx ends or
// timeout passes. what describes the failure ("etcd at X not healthy"); on
// timeout the error reads "<what> after <timeout>: <cond's last error>".
// cond gets a context bounded by the overall deadline.
func poll(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var last error
	for {
		done, err := cond(ctx)
		if done {
			return nil
		}
		var stop errStopPolling
		if errors.As(err, &stop) {
			return fmt.Errorf("%s: %w", what, stop.err)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = context.Cause(ctx)
			}
			return fmt.Errorf("%s after %s: %w", what, timeout, last)
		case <-ticker.C:
		}
	}
}
