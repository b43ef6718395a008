package localproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/localproxy"
)

// nodeRead is one scripted answer to a read of the Node: a zone label
// (none if noLabel) or an error.
type nodeRead struct {
	zone    string
	noLabel bool
	err     error
}

// scriptedNodes answers reads of the Node from a script, recording when
// each came; past the end of the script it repeats the last answer.
type scriptedNodes struct {
	mu     sync.Mutex
	script []nodeRead
	at     []time.Time
	opts   []metav1.GetOptions
}

func (s *scriptedNodes) get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.script[min(len(s.at), len(s.script)-1)]
	s.at = append(s.at, time.Now())
	s.opts = append(s.opts, opts)
	if r.err != nil {
		return nil, r.err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if !r.noLabel {
		n.Labels[corev1.LabelTopologyZone] = r.zone
	}
	return n, nil
}

func (s *scriptedNodes) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

// The learner reads the Node at once, retries with a doubling backoff
// while it cannot be read or has no label, then reads it every interval,
// following a change and a removal of the label; the problem of the last
// read is what /status shows.
func TestZoneLearner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nodes := schema.GroupResource{Resource: "nodes"}
		s := &scriptedNodes{script: []nodeRead{
			{err: apierrors.NewForbidden(nodes, "n1", errors.New("no RBAC"))},
			{err: apierrors.NewNotFound(nodes, "n1")},
			{err: errors.New("connection refused")},
			{noLabel: true},
			{zone: "zone-a"},
			{zone: "zone-a"},
			{zone: "zone-b"},
			{noLabel: true},
		}}
		var applied []string
		const interval = time.Minute
		z := localproxy.NewZoneLearner(s.get, "n1", interval, func(zone string) { applied = append(applied, zone) }, logr.Discard())
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); z.Run(ctx) }()

		start := time.Now()
		wantProblems := []string{
			`reading node n1 is forbidden (want RBAC get on nodes, as the chart's ClusterRole grants): nodes "n1" is forbidden: no RBAC`,
			"node n1 not found (not registered yet, or --node-name is not this node's name)",
			"reading node n1: connection refused",
			"node n1 has no topology.kubernetes.io/zone label",
			"", "", "",
			"node n1 has no topology.kubernetes.io/zone label",
		}
		wantApplied := [][]string{nil, nil, nil, nil, {"zone-a"}, {"zone-a"}, {"zone-a", "zone-b"}, {"zone-a", "zone-b", ""}}
		for i := range s.script {
			for s.reads() <= i {
				time.Sleep(time.Millisecond)
			}
			synctest.Wait()
			assert.Equal(t, wantProblems[i], z.Problem(), "read %d", i)
			assert.Equal(t, wantApplied[i], applied, "read %d", i)
		}
		// Backoff 1s, 2s, 4s, 8s (±20%) while nothing is learned, then
		// the interval (±20%) while the label is there, then 1s again.
		wantGaps := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, interval, interval, interval}
		prev := start
		for i, at := range s.at[:len(wantGaps)] {
			gap := at.Sub(prev)
			assert.InDelta(t, float64(wantGaps[i]), float64(gap), 0.2*float64(wantGaps[i])+float64(time.Millisecond), "gap before read %d: %v", i, gap)
			prev = at
		}
		for s.reads() < len(s.script)+1 {
			time.Sleep(time.Millisecond)
		}
		assert.InDelta(t, float64(time.Second), float64(s.at[len(s.script)].Sub(prev)), 0.2*float64(time.Second)+float64(time.Millisecond), "the label gone: backoff from 1s again")
		for _, o := range s.opts {
			assert.Equal(t, "0", o.ResourceVersion, "reads are served from the API server's cache")
		}
		cancel()
		<-done
	})
}

// With a negative interval the Node is read only until its label was
// read once.
func TestZoneLearnerOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &scriptedNodes{script: []nodeRead{{noLabel: true}, {zone: "zone-a"}}}
		var applied []string
		z := localproxy.NewZoneLearner(s.get, "n1", -1, func(zone string) { applied = append(applied, zone) }, logr.Discard())
		z.Run(t.Context()) // returns once the label was read
		assert.Equal(t, 2, s.reads())
		assert.Equal(t, []string{"zone-a"}, applied)
		assert.Empty(t, z.Problem())
	})
}

// fakeNodeAPI answers GET /api/v1/nodes/n1 with the Node, labelled with
// zone, once release is closed; with 403 if forbid.
func fakeNodeAPI(t *testing.T, zone string, forbid bool, release <-chan struct{}) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/v1/nodes/n1" {
			http.NotFound(w, r)
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		if forbid {
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure",
				Message: `nodes "n1" is forbidden: User "system:serviceaccount:kube-system:apifailover-localproxy" cannot get resource "nodes"`, Reason: metav1.StatusReasonForbidden, Code: 403})
			return
		}
		json.NewEncoder(w).Encode(corev1.Node{
			TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelTopologyZone: zone}},
		})
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// The proxy serves before it knows its zone, reads the Node through its
// own upstreams (the only way to the API here), and then prefers the API
// server in the node's zone; /status and zone_info say so.
func TestProxyLearnsNodeZone(t *testing.T) {
	release := make(chan struct{})
	a, b := fakeNodeAPI(t, "zone-a", false, release), fakeNodeAPI(t, "zone-a", false, release)
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: pemOf(a.Certificate().Raw)}, BearerToken: "token"}
	port := freeLocalPort(t)
	cfg := localproxy.Config{
		Endpoints:       []string{b.Listener.Addr().String() + "@zone-b", a.Listener.Addr().String() + "@zone-a"},
		ListenAddresses: []string{"127.0.0.1:" + port},
		NodeName:        "n1",
		NodeClient:      localproxy.DiscoveryConfig(base, "127.0.0.1:"+port, "example.com"),
	}
	cfg.Pool.IsLocal = func(string) bool { return false }
	r := start(t, cfg)

	st := r.Status()
	assert.Equal(t, "", st.Zone)
	assert.Equal(t, localproxy.ZoneFromNone, st.ZoneSource)
	assert.Equal(t, "n1", st.Node)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_zone_info", "zone", "", "source", "none"))
	// Serving while the Node's read waits.
	c := dial(t, r.addr())
	_, err := c.Write([]byte("GET /api/v1/nodes/n2 HTTP/1.1\r\nHost: x\r\n\r\n")) // not TLS: answered with 400 by the TLS server
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	require.NoError(t, err, "a client is served while the zone is not known")
	assert.Equal(t, 1, n)

	close(release)
	require.Eventually(t, func() bool { return r.Status().Zone == "zone-a" }, 20*time.Second, 10*time.Millisecond)
	st = r.Status()
	assert.Equal(t, localproxy.ZoneFromNode, st.ZoneSource)
	assert.Empty(t, st.ZoneProblem)
	assert.Equal(t, a.Listener.Addr().String(), r.Pool().Candidates()[0], "the API server in the node's zone goes first")
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_zone_info", "zone", "zone-a", "source", "node"))
	assert.Equal(t, 0.0, metric(t, r.reg, "apifailover_localproxy_zone_info", "source", "none"), "one series")
}

// Without RBAC to get nodes, the proxy runs without a zone and says why.
func TestProxyNodeZoneForbidden(t *testing.T) {
	release := make(chan struct{})
	close(release)
	api := fakeNodeAPI(t, "", true, release)
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: pemOf(api.Certificate().Raw)}, BearerToken: "token"}
	port := freeLocalPort(t)
	r := start(t, localproxy.Config{
		Endpoints:       []string{api.Listener.Addr().String()},
		ListenAddresses: []string{"127.0.0.1:" + port},
		NodeName:        "n1",
		Discovery:       localproxy.DiscoveryConfig(base, "127.0.0.1:"+port, "example.com"), // the node's client too
	})
	require.Eventually(t, func() bool { return r.Status().ZoneProblem != "" }, 20*time.Second, 10*time.Millisecond)
	st := r.Status()
	assert.Contains(t, st.ZoneProblem, "reading node n1 is forbidden (want RBAC get on nodes")
	assert.Contains(t, st.ZoneProblem, `cannot get resource "nodes"`)
	assert.Equal(t, localproxy.ZoneFromNone, st.ZoneSource)
	assert.Empty(t, st.Zone)
}

// A zone in the configuration wins: the Node is not read.
func TestConfigZoneWins(t *testing.T) {
	cfg := localproxy.Config{Endpoints: []string{"10.0.0.1:6443"}, NodeName: "n1"}
	cfg.Pool.Zone = "zone-c"
	r := start(t, cfg)
	st := r.Status()
	assert.Equal(t, "zone-c", st.Zone)
	assert.Equal(t, localproxy.ZoneFromConfig, st.ZoneSource)
	assert.Empty(t, st.Node)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_zone_info", "zone", "zone-c", "source", "config"))

	_, err := localproxy.New(localproxy.Config{Endpoints: []string{"10.0.0.1:6443"}, NodeName: "n1"})
	require.EqualError(t, err, "localproxy: NodeName needs NodeClient or Discovery, the client configuration to read the Node with")
	cfg = localproxy.Config{Endpoints: []string{"10.0.0.1:6443"}}
	cfg.Pool.Zone = "-bad"
	_, err = localproxy.New(cfg)
	require.EqualError(t, err, `localproxy: Pool.Zone: zone "-bad" is not a label value; want `+localproxy.ZoneRule)
}
