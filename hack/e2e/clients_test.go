package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/apifailover/apifailover/hack/frontproxy"
	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// TestClients checks the transport with clients other than the workload's
// informer: a controller-runtime manager, and a client that knows only a
// front proxy and learns the API servers from its Alt-Svc headers.
func TestClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bed := startBed(t, ctx)
	t.Run("controller-runtime manager", func(t *testing.T) { controllerRuntime(t, ctx, bed) })
	if err := bed.Heal(ctx); err != nil {
		t.Fatalf("heal: %v", err)
	}
	t.Run("Alt-Svc front proxy", func(t *testing.T) { altSvcFrontProxy(t, ctx, bed) })
}

// controllerRuntime: a rest.Config in, a working manager out, and its cache
// keeps up when the apiserver serving it is killed.
func controllerRuntime(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	f, err := transport.Wrap(ctx, bed.RESTConfig(testbed.Origin), transport.Options{})
	require.NoError(t, err)
	defer f.Close()
	mgr, err := manager.New(f.Config(), manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	require.NoError(t, err)
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))

	victim := servingAPIServer(t, bed, f)
	// Writes go straight to another apiserver, so they do not depend on
	// the client under test.
	var writer *testbed.APIServer
	for _, s := range bed.APIServers() {
		if s != victim {
			writer = s
			break
		}
	}
	direct, err := kubernetes.NewForConfig(bed.RESTConfig(testbed.Direct(writer.Index())))
	require.NoError(t, err)
	ns := fmt.Sprintf("cr-%d", time.Now().UnixNano())
	_, err = direct.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	seen := func(name string) func() bool {
		return func() bool {
			var cm corev1.ConfigMap
			return mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &cm) == nil
		}
	}
	create := func(name string) {
		_, err := direct.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	create("before")
	require.Eventually(t, seen("before"), 30*time.Second, 20*time.Millisecond, "the manager's cache never saw the ConfigMap")

	require.NoError(t, victim.Kill())
	killed := time.Now()
	create("after")
	require.Eventually(t, seen("after"), 30*time.Second, 20*time.Millisecond, "the manager's cache stopped after %s was killed", victim.Name())
	t.Logf("controller-runtime cache saw a create %s after %s (serving it) was killed", time.Since(killed).Round(time.Millisecond), victim.Name())
}

// servingAPIServer returns the apiserver holding the Failover's connections.
func servingAPIServer(t *testing.T, bed *testbed.Bed, f *transport.Failover) *testbed.APIServer {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		most := 0
		for a, n := range f.OpenConns() {
			if n > most {
				addr, most = a, n
			}
		}
		return most > 0
	}, 10*time.Second, 20*time.Millisecond)
	for _, s := range bed.APIServers() {
		if s.Addr() == addr {
			return s
		}
	}
	t.Fatalf("no apiserver at %s", addr)
	return nil
}

// altSvcFrontProxy: a client that knows only a front proxy learns the real
// apiservers from its Alt-Svc headers, moves to them, and keeps working
// when the front proxy dies.
func altSvcFrontProxy(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	var backends []string
	for _, s := range bed.APIServers() {
		backends = append(backends, s.Addr())
	}
	fp, err := frontproxy.Start(frontproxy.Config{
		Addr:        "127.0.0.2:6443",
		Certificate: bed.ServingCertificate(),
		CAPEM:       bed.CAPEM(),
		ServerName:  bed.OriginName(),
		Backends:    func() []string { return backends },
	})
	require.NoError(t, err)
	defer fp.Kill()

	cfg := bed.RESTConfig(testbed.Origin)
	cfg.Host = "https://" + fp.Addr() // the TLS server name stays the origin name
	f, err := transport.Wrap(ctx, cfg, transport.Options{
		DisableDiscovery: true,
		AltSvc:           &transport.AltSvcOptions{AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/24")}},
	})
	require.NoError(t, err)
	defer f.Close()
	cs, err := kubernetes.NewForConfigAndClient(f.Config(), f.HTTPClient())
	require.NoError(t, err)
	get := func() error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}
	require.NoError(t, get())
	require.Positive(t, fp.Requests.Load(), "the first request goes to the front proxy, the only endpoint known")

	learned := time.Now()
	require.Eventually(t, func() bool {
		require.NoError(t, get())
		healthy := 0
		for _, s := range f.Pool().Status() {
			if s.Sources&upstream.SourceAltSvc != 0 && s.State == upstream.StateHealthy {
				healthy++
			}
		}
		return healthy == len(backends)
	}, 30*time.Second, 50*time.Millisecond, "alternatives not learned: %+v", f.Pool().Status())
	t.Logf("learned %d apiservers from Alt-Svc in %s", len(backends), time.Since(learned).Round(time.Millisecond))

	// New requests go to the learned apiservers directly.
	require.NoError(t, get())
	before := fp.Requests.Load()
	for range 20 {
		require.NoError(t, get())
	}
	assert.Equal(t, before, fp.Requests.Load(), "requests still go through the front proxy")

	fp.Kill()
	for range 20 {
		require.NoError(t, get(), "a request failed after the front proxy died")
	}
}
