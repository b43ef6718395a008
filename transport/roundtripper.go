package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"

	"github.com/apifailover/apifailover/transport/upstream"
)

// DefaultMaxAttempts bounds how many endpoints one request may be sent to.
const DefaultMaxAttempts = 3

// failoverRoundTripper sends requests for the origin to the pool's best endpoint and
// fails over safely. A request is sent to another endpoint only when
//   - it was never sent: no connection could be had, or not one byte of its
//     header block was written on the connection (seen by an httptrace hook);
//   - the server provably did not process it: RST_STREAM(REFUSED_STREAM),
//     its stream above the last stream id of a graceful GOAWAY (decided from
//     net/http's error values and types, never from error text, which may
//     carry the server's words), or kube-apiserver's own shutdown 429 on a
//     path the apiserver serves itself (never on proxy, exec, attach or
//     portforward subresources, whose responses come from a pod or a node);
//   - or it is safe to repeat, GET, HEAD, OPTIONS or TRACE.
//
// In every case its body must be replayable (none, or GetBody set). Any
// other method, whatever its headers (kube-apiserver ignores
// Idempotency-Key), is never repeated once it may have reached a server.
// Each endpoint is tried at most once per request, and at most MaxAttempts
// endpoints in all; the final error joins every endpoint's error, or, when
// every endpoint tried refused with the shutdown 429, the last 429 is
// returned as it came so that client-go honours its Retry-After. Requests
// for other hosts go to next unchanged.
type failoverRoundTripper struct {
	conns       *connPool
	next        http.RoundTripper
	maxAttempts int
	// altUsed adds Alt-Used to requests sent to an endpoint learned from
	// Alt-Svc (RFC 7838 section 5).
	altUsed bool
}

var _ http.RoundTripper = (*failoverRoundTripper)(nil)

// WrappedRoundTripper returns the http.RoundTripper used for requests that are
// not for the origin.
func (rt *failoverRoundTripper) WrappedRoundTripper() http.RoundTripper { return rt.next }

// RoundTrip implements http.RoundTripper.
func (rt *failoverRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "https" || canonicalHostPort(req.URL.Host, "443") != rt.conns.origin {
		if rt.next == nil {
			return nil, fmt.Errorf("transport: no route for %s", req.URL.Redacted())
		}
		return rt.next.RoundTrip(req)
	}
	var exclude map[string]bool
	var errs []error
	// refused is the last shutdown 429, returned if no later attempt
	// succeeds or fails in a way the caller must hear about.
	var refused *http.Response
	for attempt := 1; ; attempt++ {
		c, err := rt.conns.get(req.Context(), exclude)
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			errs = append(errs, err)
			break
		}
		c.gotConn(req)
		// out is this attempt's request: with Alt-Used when it goes to
		// an alternative, a clone, so that req, rewound for the next
		// attempt, carries none.
		out := req
		if rt.altUsed && c.addr != rt.conns.origin && rt.conns.pool.Sources(c.addr)&upstream.SourceAltSvc != 0 {
			out = req.Clone(req.Context())
			out.Header.Set("Alt-Used", c.addr)
		}
		send, wrote := traceWrites(out, c.wake)
		resp, err := c.cc.RoundTrip(send)
		reason := ""
		if err == nil {
			resp.Request = out
			if !replayable(out) {
				return withConnBody(resp, c.cc), nil
			}
			isRefusal, r := shutdownRefusal(out, resp)
			if !isRefusal {
				closeResponse(refused)
				return withConnBody(r, c.cc), nil
			}
			// kube-apiserver is shutting down and did not process the
			// request.
			closeResponse(refused)
			refused = r
			err = fmt.Errorf("server shutting down: %s", resp.Status)
			reason = "shutdown"
		} else {
			rt.passive(c, err)
			reason = retryReason(out, err, wrote)
		}
		errs = append(errs, fmt.Errorf("%s: %w", c.addr, err))
		if reason == "" {
			// The request may have been processed: the caller must
			// hear of it, not of an earlier refusal.
			closeResponse(refused)
			refused = nil
			break
		}
		if attempt >= rt.maxAttempts || req.Context().Err() != nil {
			break
		}
		next, rerr := rewind(req)
		if rerr != nil {
			errs = append(errs, rerr)
			break
		}
		req = next
		if exclude == nil {
			exclude = make(map[string]bool)
		}
		exclude[c.addr] = true
		rt.conns.m.failover("retry")
		rt.conns.log.V(2).Info("retrying request on another endpoint", "method", req.Method, "path", req.URL.Path, "failed", c.addr, "reason", reason)
	}
	if refused != nil && req.Context().Err() == nil {
		return refused, nil
	}
	closeResponse(refused)
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

// passive tells the pool what a failed request revealed about its endpoint.
// It goes by error types and values only; the worst a misread error could do
// is rank the endpoint lower (FailureGoAway) or count a lost connection that
// net/http reported anyway (c.cc.Err).
func (rt *failoverRoundTripper) passive(c *clientConn, err error) {
	switch {
	case isGoAway(err):
		rt.conns.pool.ReportFailure(c.addr, upstream.FailureGoAway, err)
	case c.cc.Err() != nil:
		rt.conns.mu.Lock()
		byPool := c.closedByPool
		rt.conns.mu.Unlock()
		if !byPool {
			rt.conns.pool.ReportFailure(c.addr, upstream.FailureConnLost, err)
		}
	}
}

// retryReason says why req may be sent to another endpoint after err, or ""
// if it must not be. wrote reports whether any of req's header block may
// have been written on the connection.
func retryReason(req *http.Request, err error, wrote func() bool) string {
	if req.Context().Err() != nil {
		return ""
	}
	if !replayable(req) {
		return ""
	}
	if idempotent(req) {
		return "idempotent"
	}
	if isUnprocessed(err, wrote) {
		return "unprocessed"
	}
	return ""
}

// isUnprocessed reports errors after which the server provably did not
// process the request: none of it was written on the connection, it was
// refused (REFUSED_STREAM), or its stream was above the last stream id of a
// graceful GOAWAY. See h2errors.go for how net/http reports each.
func isUnprocessed(err error, wrote func() bool) bool {
	if wrote != nil && !wrote() {
		return true
	}
	if isRefusedStream(err) {
		return true
	}
	g := goAwayAbove()
	return g != nil && err == g
}

// traceWrites returns req to send with an httptrace hook on its header
// block being written: it calls wake's WroteHeaders (if wake is set), and
// for a request that is not idempotent notes the write, reported by
// wrote. Idempotent requests get wrote nil: they are retried whatever
// happened. With neither to do, req is returned as it is.
//
// net/http calls WroteHeaders once the whole header block has been handed
// to the connection (HTTP/2: the HEADERS frames written, even if that
// failed; HTTP/1.1: the blank line after the fields buffered). Before that,
// a server cannot have a complete request, so it cannot have processed it.
// On every error path that returns without the context being done, the
// request's writer has finished before RoundTrip returns.
//
// wake wakes the held connection of the request's server
// (clientConn.wake) after the write, not before: over HTTP/2 a PING that
// goes on that wake is sent after the request, so a server that froze
// before it read the request leaves the PING unanswered. Over HTTP/1.1
// (a server that does not speak HTTP/2) the header block is only
// buffered then, and written once the body is, at once for a request
// without one: a PING can still go first there, by that long. wake is
// shared by the requests of a connection: a request that carries no
// trace of its own gets it as it is (WithClientTrace changes a trace
// only to compose it with one the context has), others a trace of their
// own.
func traceWrites(req *http.Request, wake *httptrace.ClientTrace) (send *http.Request, wrote func() bool) {
	if idempotent(req) || !replayable(req) {
		switch {
		case wake == nil:
			return req, nil
		case httptrace.ContextClientTrace(req.Context()) == nil:
			return req.WithContext(httptrace.WithClientTrace(req.Context(), wake)), nil
		}
		return withWroteHeaders(req, wake.WroteHeaders), nil
	}
	var w atomic.Bool
	hook := func() { w.Store(true) }
	if wake != nil {
		hook = func() { w.Store(true); wake.WroteHeaders() }
	}
	return withWroteHeaders(req, hook), w.Load
}

// withWroteHeaders returns req with hook as its trace's WroteHeaders, on
// top of any trace req already has.
func withWroteHeaders(req *http.Request, hook func()) *http.Request {
	return req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{WroteHeaders: hook}))
}

// idempotent reports whether repeating req cannot change the outcome: the
// safe methods. PUT and DELETE are not included: a repeated DELETE answers
// 404 for an object the first attempt deleted, a repeated PUT may answer
// 409. No header makes a request idempotent: kube-apiserver ignores
// Idempotency-Key, so a generateName create carrying one would be made
// twice.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind returns req ready to be sent again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("rewinding request body: %w", err)
	}
	next := *req
	next.Body = body
	return &next, nil
}

// kube-apiserver's shutdown refusal, as k8s.io/apiserver v0.36
// pkg/server/filters/with_retry_after.go (WithRetryAfter, enabled by
// --shutdown-send-retry-after) writes it for a request that arrives once
// the server no longer accepts new ones, before any handler runs:
//
//	w.Header().Set("Connection", "close")
//	w.Header().Set("Retry-After", "5")
//	http.Error(w, "The apiserver is shutting down, please try again later.", 429)
//
// http.Error adds Content-Type and X-Content-Type-Options and a newline. Over
// HTTP/2, net/http's server drops the Connection field and sends GOAWAY
// instead, so only HTTP/1.x responses show it.
const (
	shutdownRetryAfter  = "5"
	shutdownContentType = "text/plain; charset=utf-8"
	shutdownBody        = "The apiserver is shutting down, please try again later.\n"
)

// shutdownRefusal reports whether resp is kube-apiserver's own shutdown 429
// (see shutdownBody), in which case req was not processed. Only responses
// for paths that kube-apiserver answers itself count (apiserverAnswers). An
// API Priority and Fairness 429 means overload and is returned as is. The
// returned response carries the whole body again if it had to be read; a
// refusal's body is read in full and its connection released.
func shutdownRefusal(req *http.Request, resp *http.Response) (bool, *http.Response) {
	h := resp.Header
	if resp.StatusCode != http.StatusTooManyRequests ||
		!apiserverAnswers(req.URL.Path) ||
		!onlyValue(h, "Retry-After", shutdownRetryAfter) ||
		!onlyValue(h, "Content-Type", shutdownContentType) ||
		!onlyValue(h, "X-Content-Type-Options", "nosniff") ||
		h.Get("X-Kubernetes-PF-FlowSchema-UID") != "" ||
		h.Get("X-Kubernetes-PF-PriorityLevel-UID") != "" ||
		resp.ProtoMajor == 1 && !resp.Close ||
		resp.ContentLength > int64(len(shutdownBody)) {
		return false, resp
	}
	// One byte more than the message: a longer body is not the refusal.
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(len(shutdownBody))+1))
	if err == nil && string(body) == shutdownBody {
		// Nothing follows (EOF was read); release the stream.
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		return true, resp
	}
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	return false, resp
}

// onlyValue reports whether h holds exactly one value for key, v.
func onlyValue(h http.Header, key, v string) bool {
	vs := h.Values(key)
	return len(vs) == 1 && vs[0] == v
}

// passThrough are the subresources whose responses kube-apiserver relays
// from a pod, a service's pod or a node (kubelet) with their status, headers
// and body: pods/services/nodes .../proxy[/...], and the streaming pods/exec,
// pods/attach and pods/portforward, which relay the kubelet's answer when
// it does not upgrade.
var passThrough = map[string]bool{"proxy": true, "exec": true, "attach": true, "portforward": true}

// apiserverAnswers reports whether a response for path can only have been
// written by kube-apiserver (or an aggregated API server, which runs the
// same filter) itself: a clean API path (/api/..., /apis/...) with no
// segment naming a pass-through subresource. A segment is enough: resource
// names are also path segments, so a configmap named "proxy" loses the
// refusal's retry too, which costs only a delay.
func apiserverAnswers(path string) bool {
	if !strings.HasPrefix(path, "/api/") && !strings.HasPrefix(path, "/apis/") {
		return false
	}
	for seg := range strings.SplitSeq(path[1:], "/") {
		if seg == "" || seg == "." || seg == ".." || passThrough[seg] {
			return false
		}
	}
	return true
}

// apiserverWrote reports whether kube-apiserver wrote the response to a
// request for path, headers included, rather than relaying a pod's or a
// node's (passThrough): /api, /apis, /version, and what apiserverAnswers.
// An aggregated API server (an APIService's, which a cluster admin
// installs) writes its own answers under /apis/<its group>: those count
// as kube-apiserver's.
func apiserverWrote(path string) bool {
	switch path {
	case "/api", "/apis", "/version":
		return true
	}
	return apiserverAnswers(path)
}

func closeResponse(resp *http.Response) {
	if resp != nil {
		resp.Body.Close()
	}
}

// connBody is a response body that ends with io.ErrUnexpectedEOF, as an
// HTTP/1.1 body does, when its connection is gone: closed because its
// endpoint went down or was removed, or lost (unanswered ping, reset).
// HTTP/2 reports those as its own errors ("http2: client connection force
// closed via ClientConn.Close", "http2: client connection lost"), which
// client-go's watch decoder turns into an error event: the informer then
// relists after a backoff. An unexpected EOF ends the watch instead, and
// the reflector resumes it at once from its last resource version on
// another endpoint: no relist, no event lost. Other errors (the request's
// context, a stream reset by the server) pass unchanged.
type connBody struct {
	io.ReadCloser
	cc *http.ClientConn
}

func withConnBody(resp *http.Response, cc *http.ClientConn) *http.Response {
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &connBody{ReadCloser: resp.Body, cc: cc}
	}
	return resp
}

// Read implements io.Reader.
func (b *connBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.cc.Err() != nil {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
