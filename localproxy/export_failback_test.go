package localproxy

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// RunFailback runs the fail-back of settle and rate over pool and reg
// until ctx is done; closed is told the endpoint of each connection
// closed.
func RunFailback[C endpoint.Conn](ctx context.Context, pool *upstream.Pool, reg *endpoint.Registry[C], settle time.Duration, rate float64, closed func(string), log logr.Logger) {
	newFailback(pool, reg, settle, rate, closed, log).run(ctx)
}

// FailbackOn reports whether p runs fail-back.
func (p *Proxy) FailbackOn() bool { return p.back != nil }
