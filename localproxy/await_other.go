//go:build !linux

package localproxy

import (
	"errors"
	"sync/atomic"
	"time"
)

// poller: elsewhere than on Linux there is none, and directions wait for
// data on their own goroutines.
type poller struct {
	splicing *atomic.Int32
	count    func(*loopTally)
}

// newPoller returns no poller.
func newPoller() (*poller, error) { return nil, nil }

func (*poller) run()                     {}
func (*poller) close()                   {}
func (*poller) add(*conn) uint64         { return 0 }
func (*poller) remove(uint64)            {}
func (*poller) at(*loopTimer, time.Time) {}
func (*poller) stop(*loopTimer)          {}
func (*poller) arm(*direction, uint64) error {
	return errors.ErrUnsupported
}
