package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"golang.org/x/net/http2"

	"github.com/apifailover/apifailover/transport/upstream"
)

// DefaultMaxAttempts bounds how many endpoints one request may be sent to.
const DefaultMaxAttempts = 3

// RoundTripper sends requests for the origin to the pool's best endpoint and
// fails over safely: a request is sent to another endpoint only when it was
// never sent (the connection could not be established), when the server
// provably did not process it (REFUSED_STREAM, a stream above a GOAWAY's last
// stream id, a shutdown 429 that closes the connection), or when it is safe
// to repeat (GET, HEAD, OPTIONS or an Idempotency-Key header) and its body
// can be replayed. Each endpoint is tried at most once per request, and at
// most MaxAttempts endpoints in all; the final error joins every endpoint's
// error. Requests for other hosts go to next unchanged.
type RoundTripper struct {
	conns       *connPool
	next        http.RoundTripper
	maxAttempts int
	// altUsed adds Alt-Used to requests sent to an endpoint learned from
	// Alt-Svc (RFC 7838 section 5).
	altUsed bool
}

var _ http.RoundTripper = (*RoundTripper)(nil)

// WrappedRoundTripper returns the RoundTripper used for requests that are
// not for the origin.
func (rt *RoundTripper) WrappedRoundTripper() http.RoundTripper { return rt.next }

// RoundTrip implements http.RoundTripper.
func (rt *RoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "https" || canonicalHostPort(req.URL.Host, "443") != rt.conns.origin {
		if rt.next == nil {
			return nil, fmt.Errorf("transport: no route for %s", req.URL.Redacted())
		}
		return rt.next.RoundTrip(req)
	}
	var exclude map[string]bool
	var errs []error
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
		if rt.altUsed && c.addr != rt.conns.origin && rt.conns.pool.Sources(c.addr)&upstream.SourceAltSvc != 0 {
			req = req.Clone(req.Context())
			req.Header.Set("Alt-Used", c.addr)
		}
		resp, err := c.cc.RoundTrip(req)
		reason := ""
		if err == nil {
			if !replayable(req) {
				return withConnBody(resp, c.cc), nil
			}
			refused, r := shutdownRefusal(resp)
			if !refused {
				return withConnBody(r, c.cc), nil
			}
			// The server is shutting down and did not process the request.
			err = fmt.Errorf("server shutting down: %s", resp.Status)
			reason = "shutdown"
		} else {
			rt.passive(c, err)
			reason = retryReason(req, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", c.addr, err))
		if reason == "" || attempt >= rt.maxAttempts || req.Context().Err() != nil {
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
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

// passive tells the pool what a failed request revealed about its endpoint.
func (rt *RoundTripper) passive(c *clientConn, err error) {
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
// if it must not be.
func retryReason(req *http.Request, err error) string {
	if req.Context().Err() != nil {
		return ""
	}
	if !replayable(req) {
		return ""
	}
	if isUnprocessed(err) {
		return "unprocessed"
	}
	if idempotent(req) {
		return "idempotent"
	}
	return ""
}

// isUnprocessed reports errors after which the server provably did not
// process the request: it was never sent on the connection, it was refused
// (REFUSED_STREAM), or its stream was above the last stream id of a GOAWAY.
// The HTTP/2 implementation in net/http does not export these errors, so
// they are matched by text; TestUnprocessedErrors pins the texts.
func isUnprocessed(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream {
		return true
	}
	msg := err.Error()
	for _, s := range unprocessedTexts {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

var unprocessedTexts = []string{
	"http2: Transport received Server's graceful shutdown GOAWAY",
	"http2: client conn not usable",
	"http2: client conn could not be established",
}

func isGoAway(err error) bool {
	return strings.Contains(err.Error(), "GOAWAY")
}

// idempotent reports whether repeating req cannot change the outcome: safe
// methods, or a request carrying an idempotency key. PUT and DELETE are not
// included: a repeated DELETE answers 404 for an object the first attempt
// deleted, a repeated PUT may answer 409.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
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

// shutdownMessage is the body text of the 429 kube-apiserver sends for
// requests that arrive while it shuts down (--shutdown-send-retry-after).
const shutdownMessage = "apiserver is shutting down"

// maxRefusalBody bounds how much of a 429 body is read to classify it.
const maxRefusalBody = 16 << 10

// shutdownRefusal reports whether resp is the 429 kube-apiserver sends while
// shutting down: Retry-After set, no API Priority and Fairness headers, and
// the connection closing or the shutdown message in the body. Such a request
// was not processed. An APF 429 means overload and is returned as is. When
// the body had to be read, the returned response carries it again; when the
// response is a refusal, its body is closed.
func shutdownRefusal(resp *http.Response) (bool, *http.Response) {
	if resp.StatusCode != http.StatusTooManyRequests ||
		resp.Header.Get("Retry-After") == "" ||
		resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID") != "" ||
		resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID") != "" {
		return false, resp
	}
	if resp.Close || strings.EqualFold(resp.Header.Get("Connection"), "close") {
		drain(resp)
		return true, resp
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
	if err == nil && strings.Contains(string(body), shutdownMessage) {
		drain(resp)
		return true, resp
	}
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	return false, resp
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

func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
