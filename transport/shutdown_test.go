package transport_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
)

// shutdownBody is the body of kube-apiserver's shutdown 429.
const shutdownBody = "The apiserver is shutting down, please try again later.\n"

// apiserverShutdown answers as kube-apiserver v1.36 does once it no longer
// accepts requests (k8s.io/apiserver pkg/server/filters/with_retry_after.go,
// --shutdown-send-retry-after).
func apiserverShutdown(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "5")
	http.Error(w, "The apiserver is shutting down, please try again later.", http.StatusTooManyRequests)
}

// postCount sends a POST to path and returns the response's status and body
// and how many servers of c received it.
func postCount(t *testing.T, c *cluster, f *transport.Failover, path string) (int, string, int) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+path, bytes.NewReader([]byte(`{"metadata":{"generateName":"x-"}}`)))
	require.NoError(t, err)
	resp, err := f.HTTPClient().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	total := 0
	for _, s := range c.servers {
		total += s.count("POST " + path)
	}
	return resp.StatusCode, string(body), total
}

func TestShutdownTooManyRequestsGoesElsewhere(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	victim := serving(t, c, f)
	victim.setHandler(apiserverShutdown)
	const path = "/api/v1/namespaces/default/configmaps"
	code, body, _ := postCount(t, c, f, path)
	assert.Equal(t, http.StatusOK, code)
	assert.NotEqual(t, victim.name, body)
	assert.Equal(t, 1, victim.count("POST "+path))
}

// When every server refuses, the caller gets the last refusal as it came,
// so that client-go waits for its Retry-After and tries again.
func TestShutdownEverywhereReturnsTheRefusal(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	for _, s := range c.servers {
		s.setHandler(apiserverShutdown)
	}
	const path = "/api/v1/namespaces/default/configmaps"
	code, body, total := postCount(t, c, f, path)
	assert.Equal(t, http.StatusTooManyRequests, code)
	assert.Equal(t, shutdownBody, body)
	assert.Equal(t, 3, total, "each server is tried once")
}

// A proxy subresource passes the status, headers and body of a pod (or a
// node) through unchanged: a 429 that looks exactly like kube-apiserver's
// shutdown refusal may come from a pod that processed the request.
func TestShutdownLookalikeThroughProxyIsNotRetried(t *testing.T) {
	for _, path := range []string{
		"/api/v1/namespaces/default/pods/web/proxy",
		"/api/v1/namespaces/default/pods/web:8080/proxy/submit",
		"/api/v1/namespaces/default/pods/https:web:8443/proxy/a/b",
		"/api/v1/namespaces/default/services/web/proxy/",
		"/api/v1/namespaces/default/services/https:web:443/proxy/submit",
		"/api/v1/nodes/node-1/proxy/run",
		"/api/v1/nodes/node-1:10250/proxy/",
		"/apis/example.com/v1/namespaces/default/widgets/w/proxy/x",
		"/api/v1/namespaces/default/pods/web/exec",
		"/api/v1/namespaces/default/pods/web/attach",
		"/api/v1/namespaces/default/pods/web/portforward",
		"/api/v1/namespaces/default/pods/web/./proxy/x",
		"/api/v1/namespaces/default/pods/web//proxy",
		"/healthz/x",
		"/submit",
	} {
		t.Run(path, func(t *testing.T) {
			c := newCluster(t, 3)
			f := wrap(t, c, transport.Options{})
			for _, s := range c.servers {
				s.setHandler(apiserverShutdown)
			}
			code, body, total := postCount(t, c, f, path)
			assert.Equal(t, http.StatusTooManyRequests, code)
			assert.Equal(t, shutdownBody, body, "the caller gets the body intact")
			assert.Equal(t, 1, total, "the POST was sent again to another server")
		})
	}
}

// Only kube-apiserver's own shutdown response counts: a 429 that shares
// some of its details is returned as it is.
func TestShutdownLookalikeIsNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		body    string
	}{
		{"message in a Status object", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "5")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"kind":"Status","message":"The apiserver is shutting down, please try again later.","reason":"TooManyRequests","code":429}`)
		}, `{"kind":"Status","message":"The apiserver is shutting down, please try again later.","reason":"TooManyRequests","code":429}`},
		{"other Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			http.Error(w, "The apiserver is shutting down, please try again later.", http.StatusTooManyRequests)
		}, shutdownBody},
		{"message within other text", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "5")
			http.Error(w, "upstream says: The apiserver is shutting down, please try again later.", http.StatusTooManyRequests)
		}, "upstream says: " + shutdownBody},
		{"no nosniff", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "5")
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, shutdownBody)
		}, shutdownBody},
		{"API Priority and Fairness", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Kubernetes-PF-FlowSchema-UID", "fs")
			apiserverShutdown(w, r)
		}, shutdownBody},
		{"503", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "5")
			http.Error(w, "The apiserver is shutting down, please try again later.", http.StatusServiceUnavailable)
		}, shutdownBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3)
			f := wrap(t, c, transport.Options{})
			for _, s := range c.servers {
				s.setHandler(tc.handler)
			}
			code, body, total := postCount(t, c, f, "/api/v1/namespaces/default/configmaps")
			assert.NotEqual(t, http.StatusOK, code)
			assert.Equal(t, tc.body, body, "the caller gets the body intact")
			assert.Equal(t, 1, total, "the POST was sent again to another server")
		})
	}
}
