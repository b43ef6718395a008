package workload_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/workload"
)

// A GET whose connection is cut without an answer is sent again by
// client-go when it may retry (MaxRetries > 0), and CountAttempts sees
// both tries; a POST is sent once whatever MaxRetries says.
func TestCountAttempts(t *testing.T) {
	var cut atomic.Bool // the next request's connection is cut, once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.CompareAndSwap(true, false) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`))
	}))
	t.Cleanup(srv.Close)

	hc := &http.Client{Transport: workload.CountAttempts(http.DefaultTransport.(*http.Transport).Clone())}
	cs, err := kubernetes.NewForConfigAndClient(&rest.Config{Host: srv.URL}, hc)
	require.NoError(t, err)
	rc := cs.CoreV1().RESTClient()

	cut.Store(true)
	ctx, attempts := workload.WithAttempts(t.Context())
	err = rc.Get().Resource("namespaces").Name("x").MaxRetries(0).Do(ctx).Error()
	assert.Error(t, err, "sent once: the cut is the answer")
	assert.Equal(t, 1, attempts())

	cut.Store(true)
	ctx, attempts = workload.WithAttempts(t.Context())
	require.NoError(t, rc.Get().Resource("namespaces").Name("x").MaxRetries(10).Do(ctx).Error())
	assert.Equal(t, 2, attempts(), "cut, then answered")

	cut.Store(true)
	ctx, attempts = workload.WithAttempts(t.Context())
	err = rc.Post().Resource("namespaces").Body([]byte(`{}`)).MaxRetries(10).Do(ctx).Error()
	assert.Error(t, err, "a cut POST is not sent again")
	assert.Equal(t, 1, attempts())

	// A request without WithAttempts's context is not counted, and works.
	require.NoError(t, rc.Get().Resource("namespaces").Name("x").MaxRetries(0).Do(t.Context()).Error())
}
