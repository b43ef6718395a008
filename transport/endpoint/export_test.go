package endpoint

import (
	"context"
	"time"

	"github.com/apifailover/apifailover/transport/upstream"
)

// PingTimeout is how long a PING may go unanswered after the round trips
// samples (the first one seeds the estimate, as the TCP connect does).
func PingTimeout(samples ...time.Duration) time.Duration {
	var e RTTEstimator
	for _, s := range samples {
		e.Sample(s)
	}
	return pingTimeout(&e)
}

// RunPingLoop runs the PING schedule of a held connection whose connect
// took seed, with ping sending one PING, until a PING fails or lost is
// closed (the failure to report is returned) or ctx is done (zero).
func RunPingLoop(ctx context.Context, interval, seed time.Duration, ping func(context.Context) error, lost <-chan struct{}) (upstream.Failure, error) {
	l := &pingLoop{interval: interval, ping: ping, lost: lost, lostErr: func() error { return errLost }}
	l.rtt.Sample(seed)
	return l.run(ctx)
}
