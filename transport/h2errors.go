package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// What net/http's HTTP/2 client says about a failed request is decided from
// error values and types, never from error text: the text of some of its
// errors embeds data from the server (a GOAWAY's debug data), so a server
// could make any error read like any other.
//
// The client (h2_bundle.go in Go 1.26) reports:
//   - a request never started on the connection (closed, or unusable after
//     a GOAWAY): errClientConnUnusable or errClientConnNotEstablished, before
//     any frame of the request is written. Unexported; the failover round tripper sees
//     this through its own httptrace hook instead (see writeTrace).
//   - RST_STREAM(REFUSED_STREAM) from the server: http2StreamError, which
//     converts to golang.org/x/net/http2.StreamError with errors.As.
//   - a GOAWAY whose last stream id is below the request's stream, with
//     NO_ERROR: the stream is aborted with errClientConnGotGoAway, an
//     unexported errors.New value returned unwrapped. goAwayAbove learns
//     that value once by making net/http produce it.
//   - a GOAWAY covering the stream, then the connection closing:
//     http2GoAwayError (LastStreamID, ErrCode, DebugData), an unexported
//     struct type without an As method. The stream may have been processed.

var goAwayOnce struct {
	sync.Once
	err error
}

// goAwayAbove returns the error net/http's HTTP/2 client gives a request
// whose stream was above the last stream id of a graceful GOAWAY, or nil if
// it could not be learned (then such requests count as maybe processed).
func goAwayAbove() error {
	goAwayOnce.Do(func() { goAwayOnce.err = learnGoAwayAbove() })
	return goAwayOnce.err
}

// learnGoAwayAbove sends one request on an in-memory HTTP/2 connection whose
// server answers its HEADERS with GOAWAY(last stream id 0, NO_ERROR), and
// returns the error the request ended with.
func learnGoAwayAbove() error {
	// Not a connection path: nothing here waits on the network, and the
	// timeout only bounds a net/http that no longer behaves as expected.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		goAwayPeer(server)
	}()
	defer func() {
		client.Close()
		server.Close()
		<-done
	}()
	t := &http.Transport{
		Protocols: new(http.Protocols),
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return client, nil
		},
	}
	t.Protocols.SetUnencryptedHTTP2(true)
	cc, err := t.NewClientConn(ctx, "http", "goaway.invalid:80")
	if err != nil {
		return nil
	}
	defer cc.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://goaway.invalid/", nil)
	if err != nil {
		return nil
	}
	resp, err := cc.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
	}
	if err == nil || ctx.Err() != nil || errors.Is(err, io.ErrClosedPipe) {
		return nil
	}
	return err
}

// goAwayPeer is the server of learnGoAwayAbove.
func goAwayPeer(c net.Conn) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		c.Close()
		return
	}
	fr := http2.NewFramer(c, c)
	headers := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		seen := false
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if _, ok := f.(*http2.HeadersFrame); ok && !seen {
				seen = true
				close(headers)
			}
		}
	}()
	if fr.WriteSettings() == nil {
		select {
		case <-headers:
			fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		case <-readDone:
		}
	}
	<-readDone // until the client closes its end
}

// isRefusedStream reports a RST_STREAM(REFUSED_STREAM) from the server: it
// did not process the stream (RFC 9113 section 8.7).
func isRefusedStream(err error) bool {
	var se http2.StreamError
	return errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream
}

// isGoAway reports errors that come from a GOAWAY sent by the server: the
// stream was above its last stream id, or the connection closed after it.
func isGoAway(err error) bool {
	if g := goAwayAbove(); g != nil && errors.Is(err, g) {
		return true
	}
	// net/http's bundled client (the only one that makes our connections)
	// reports the rest as its unexported http2GoAwayError; x/net's
	// deprecated GoAwayError never reaches us.
	for ; err != nil; err = errors.Unwrap(err) {
		if t := reflect.TypeOf(err); t.PkgPath() == "net/http" && t.Name() == "http2GoAwayError" {
			return true
		}
	}
	return false
}
