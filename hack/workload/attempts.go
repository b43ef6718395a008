package workload

import (
	"context"
	"net/http"
	"sync/atomic"
)

// A request's attempts are the times its client's RoundTripper was called
// for it: below client-go's own retries (rest.Request.MaxRetries), above
// the client under test (transport.Wrap's retries on another apiserver
// are one attempt).

type attemptsKey struct{}

// WithAttempts returns a context that counts the attempts of the requests
// made with it through a RoundTripper wrapped by CountAttempts, and a
// function that returns the count so far.
func WithAttempts(ctx context.Context) (context.Context, func() int) {
	n := new(atomic.Int32)
	return context.WithValue(ctx, attemptsKey{}, n), func() int { return int(n.Load()) }
}

// CountAttempts wraps next (http.DefaultTransport if nil) so that each
// request whose context came from WithAttempts counts its attempts.
func CountAttempts(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &attemptsRoundTripper{next: next}
}

type attemptsRoundTripper struct{ next http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (a *attemptsRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if n, ok := req.Context().Value(attemptsKey{}).(*atomic.Int32); ok {
		n.Add(1)
	}
	return a.next.RoundTrip(req)
}

// WrappedRoundTripper returns the wrapped RoundTripper.
func (a *attemptsRoundTripper) WrappedRoundTripper() http.RoundTripper { return a.next }
