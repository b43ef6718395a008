//lint:file-ignore SA1019 the v1 Endpoints fallback for node identities is what these tests exercise.

package endpoint_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

const staticAddr = "10.9.9.9:6443"

// kubeSlice is an EndpointSlice of the kubernetes Service with addrs on
// port 6443, all ready or all not ready.
func kubeSlice(name string, ready bool, addrs ...string) *discoveryv1.EndpointSlice {
	port, https := int32(6443), "https"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &https, Port: &port}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// kubeEndpoints is the kubernetes Endpoints object with ready addresses
// and not-ready ones, on port 6443.
func kubeEndpoints(ready, notReady []string) *corev1.Endpoints {
	ss := corev1.EndpointSubset{Ports: []corev1.EndpointPort{{Name: "https", Port: 6443}}}
	for _, a := range ready {
		ss.Addresses = append(ss.Addresses, corev1.EndpointAddress{IP: a})
	}
	for _, a := range notReady {
		ss.NotReadyAddresses = append(ss.NotReadyAddresses, corev1.EndpointAddress{IP: a})
	}
	return &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Subsets: []corev1.EndpointSubset{ss}}
}

// forbidSlices makes listing EndpointSlices fail with 403 while forbidden
// is set, as for a node identity.
func forbidSlices(cs *fake.Clientset, forbidden *atomic.Bool) {
	cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if forbidden.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("RBAC: access denied"))
		}
		return false, nil, nil
	})
}

// newDiscoveryPool returns a pool with one static endpoint.
func newDiscoveryPool(t *testing.T) *upstream.Pool {
	t.Helper()
	p, err := upstream.New(upstream.Config{})
	require.NoError(t, err)
	require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: staticAddr}}))
	return p
}

// runDiscoverer runs a Discoverer until the test ends.
func runDiscoverer(t *testing.T, cs kubernetes.Interface, pool *upstream.Pool, opts endpoint.DiscovererOptions) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	d := endpoint.NewDiscoverer(cs, pool, opts)
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func discovered(p *upstream.Pool) []string {
	var out []string
	for _, s := range p.Status() {
		if s.Sources&upstream.SourceDiscovery != 0 {
			out = append(out, s.Addr)
		}
	}
	slices.Sort(out)
	return out
}

func TestDiscoveryKeepsTheLastGoodSet(t *testing.T) {
	t.Run("one slice", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cs := fake.NewClientset(kubeSlice("kubernetes", true, "10.0.0.1", "10.0.0.2"))
			pool := newDiscoveryPool(t)
			runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{})
			synctest.Wait()
			good := []string{"10.0.0.1:6443", "10.0.0.2:6443"}
			require.Equal(t, good, discovered(pool))

			api := cs.DiscoveryV1().EndpointSlices("default")
			_, err := api.Update(t.Context(), kubeSlice("kubernetes", false, "10.0.0.1", "10.0.0.2"), metav1.UpdateOptions{})
			require.NoError(t, err)
			synctest.Wait()
			assert.Equal(t, good, discovered(pool), "no ready endpoint: the last good set stays")

			_, err = api.Update(t.Context(), kubeSlice("kubernetes", true), metav1.UpdateOptions{})
			require.NoError(t, err)
			synctest.Wait()
			assert.Equal(t, good, discovered(pool), "no endpoint: the last good set stays")

			require.NoError(t, api.Delete(t.Context(), "kubernetes", metav1.DeleteOptions{}))
			synctest.Wait()
			assert.Equal(t, good, discovered(pool), "no slice: the last good set stays")

			_, err = api.Create(t.Context(), kubeSlice("kubernetes", true, "10.0.0.3"), metav1.CreateOptions{})
			require.NoError(t, err)
			synctest.Wait()
			assert.Equal(t, []string{"10.0.0.3:6443"}, discovered(pool), "a smaller set applies: removals are real")
			assert.True(t, pool.Has(staticAddr))
		})
	})
	t.Run("several slices", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cs := fake.NewClientset(kubeSlice("kubernetes-a", true, "10.0.0.1"), kubeSlice("kubernetes-b", true, "10.0.0.2"))
			pool := newDiscoveryPool(t)
			runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{})
			synctest.Wait()
			require.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443"}, discovered(pool))

			api := cs.DiscoveryV1().EndpointSlices("default")
			_, err := api.Update(t.Context(), kubeSlice("kubernetes-b", false, "10.0.0.2"), metav1.UpdateOptions{})
			require.NoError(t, err)
			synctest.Wait()
			assert.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "one slice still has a ready endpoint: the other's go")

			require.NoError(t, api.Delete(t.Context(), "kubernetes-a", metav1.DeleteOptions{}))
			synctest.Wait()
			assert.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "no ready endpoint in any slice: the last good set stays")
		})
	})
	t.Run("Endpoints fallback", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cs := fake.NewClientset(kubeEndpoints([]string{"10.0.0.1", "10.0.0.2"}, nil))
			var forbidden atomic.Bool
			forbidden.Store(true)
			forbidSlices(cs, &forbidden)
			pool := newDiscoveryPool(t)
			runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{PollInterval: 10 * time.Second})
			synctest.Wait()
			good := []string{"10.0.0.1:6443", "10.0.0.2:6443"}
			require.Equal(t, good, discovered(pool))

			_, err := cs.CoreV1().Endpoints("default").Update(t.Context(), kubeEndpoints(nil, []string{"10.0.0.1", "10.0.0.2"}), metav1.UpdateOptions{})
			require.NoError(t, err)
			time.Sleep(time.Minute)
			synctest.Wait()
			assert.Equal(t, good, discovered(pool), "no ready address: the last good set stays")

			_, err = cs.CoreV1().Endpoints("default").Update(t.Context(), kubeEndpoints([]string{"10.0.0.2"}, []string{"10.0.0.1"}), metav1.UpdateOptions{})
			require.NoError(t, err)
			time.Sleep(time.Minute)
			synctest.Wait()
			assert.Equal(t, []string{"10.0.0.2:6443"}, discovered(pool), "a smaller set applies")
		})
	})
}

// A node identity that may not list EndpointSlices polls the Endpoints
// object; once RBAC allows slices, discovery goes back to them without a
// restart.
func TestDiscoveryRetriesEndpointSlicesAfterForbidden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeSlice("kubernetes", true, "10.0.0.1", "10.0.0.2"), kubeEndpoints([]string{"10.0.0.1"}, nil))
		var forbidden atomic.Bool
		forbidden.Store(true)
		forbidSlices(cs, &forbidden)
		pool := newDiscoveryPool(t)
		runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{PollInterval: 10 * time.Second})
		synctest.Wait()
		require.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "from the Endpoints fallback")

		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "still forbidden: still the fallback")

		forbidden.Store(false) // RBAC fixed
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443"}, discovered(pool), "EndpointSlices are tried again")

		// And the slice watch is what applies now.
		_, err := cs.DiscoveryV1().EndpointSlices("default").Update(t.Context(), kubeSlice("kubernetes", true, "10.0.0.2"), metav1.UpdateOptions{})
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.2:6443"}, discovered(pool))
	})
}

// An apiserver that has just started may answer 403 before its
// authorizer has synced. When listing EndpointSlices worked before, a 403
// is retried within seconds (backing off towards SliceRetryInterval while
// it lasts), not after SliceRetryInterval of polling the Endpoints, which
// lags up to PollInterval behind every change for 5 minutes.
func TestDiscoveryForbiddenAfterSlicesWorkedRetriesSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeSlice("kubernetes", true, "10.0.0.1", "10.0.0.2"), kubeEndpoints([]string{"10.0.0.1"}, nil))
		var forbidden atomic.Bool
		forbidSlices(cs, &forbidden)
		var w atomic.Pointer[watch.FakeWatcher]
		cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
			if forbidden.Load() {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("RBAC: access denied"))
			}
			fw := watch.NewFake()
			w.Store(fw)
			return true, fw, nil
		})
		pool := newDiscoveryPool(t)
		runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{PollInterval: 10 * time.Second})
		synctest.Wait()
		require.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443"}, discovered(pool), "from the slices")

		// The apiserver serving the watch restarts, a minute on; the one
		// that answers the next list is not authorizing yet.
		time.Sleep(time.Minute)
		forbidden.Store(true)
		w.Load().Stop()
		synctest.Wait()
		require.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "from the Endpoints fallback")

		forbidden.Store(false) // its authorizer synced
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443"}, discovered(pool), "EndpointSlices are listed again within seconds")

		// A 403 that lasts backs off to SliceRetryInterval: few lists.
		var lists atomic.Int32
		cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			lists.Add(1)
			return false, nil, nil
		})
		time.Sleep(time.Minute)
		forbidden.Store(true)
		w.Load().Stop()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Less(t, lists.Load(), int32(25), "a lasting 403 is retried every SliceRetryInterval (5m), after a few quicker tries")
		assert.Greater(t, lists.Load(), int32(8))
	})
}

// EndpointSlices of the kubernetes Service that nobody but their writer
// vouches for (anyone who may write slices in default can label one):
// FQDN and IPv6 slices, empty ones, not-ready and duplicate endpoints,
// bad addresses, a slice without a usable port, and a thousand addresses.
// The pool gets the valid ready IP addresses once each (nothing of an
// FQDN slice, no link-local or multicast address), at most
// MaxDiscoveredEndpoints of them, and the real apiservers among them.
func TestDiscoveryJunkSlices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		real := kubeSlice("kubernetes", true, "10.0.0.1", "10.0.0.2", "10.0.0.3")
		fqdn := kubeSlice("junk-fqdn", true, "api.example.invalid")
		fqdn.AddressType = discoveryv1.AddressTypeFQDN
		v6 := kubeSlice("junk-v6", true, "fd00::1", "fd00:0::1")
		v6.AddressType = discoveryv1.AddressTypeIPv6
		empty := kubeSlice("junk-empty", true)
		notReady := kubeSlice("junk-not-ready", false, "10.0.9.9")
		dup := kubeSlice("junk-dup", true, "10.0.0.1", "10.0.0.2", "10.0.0.1")
		bad := kubeSlice("junk-bad", true, "999.1.1.1", "", "0.0.0.0", "-x-")
		// An FQDN slice naming this host (the node-local proxy, were its
		// port given), and addresses Kubernetes refuses in IP slices:
		// link-local and multicast.
		self := kubeSlice("junk-self", true, "localhost", "127.0.0.1", "10.0.7.7")
		self.AddressType = discoveryv1.AddressTypeFQDN
		linkLocal := kubeSlice("junk-link-local", true, "169.254.169.254", "224.0.0.1")
		linkLocalV6 := kubeSlice("junk-link-local-v6", true, "fe80::1", "ff02::1")
		linkLocalV6.AddressType = discoveryv1.AddressTypeIPv6
		noPort := kubeSlice("junk-no-port", true, "10.0.8.8")
		noPort.Ports = nil
		var many []string
		for i := range 1000 {
			many = append(many, fmt.Sprintf("1.251.%d.%d", i/250, i%250+1)) // sorts before 10.0.0.x
		}
		lots := kubeSlice("junk-many", true, many...)
		cs := fake.NewClientset(real, fqdn, v6, empty, notReady, dup, bad, self, linkLocal, linkLocalV6, noPort, lots)
		pool := newDiscoveryPool(t)
		runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{})
		synctest.Wait()

		got := discovered(pool)
		assert.Len(t, got, endpoint.MaxDiscoveredEndpoints, "discovered endpoints: %v", got)
		for _, want := range []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"} {
			assert.Contains(t, got, want, "a real apiserver lost among the junk")
		}
		assert.NotContains(t, got, "10.0.9.9:6443", "a not-ready endpoint")
		assert.NotContains(t, got, "10.0.8.8:6443", "an endpoint of a slice without a port")
		for _, a := range got {
			_, err := upstream.ParseAddr(a)
			assert.NoError(t, err)
		}

		// Without the thousand, every valid ready address, once.
		require.NoError(t, cs.DiscoveryV1().EndpointSlices("default").Delete(t.Context(), "junk-many", metav1.DeleteOptions{}))
		synctest.Wait()
		assert.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443", "[fd00::1]:6443"}, discovered(pool), "nothing of an FQDN slice, no link-local or multicast address")
		assert.True(t, pool.Has(staticAddr))
	})
}

// A watch that ends at once without an error (a server, or something
// between, that closes watches as they start) is backed off like an
// error: without that, discovery watched again as fast as the watches
// ended, at the servers that were failing already.
func TestDiscoveryBacksOffWatchesThatEndAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeSlice("kubernetes", true, "10.0.0.1"))
		var watches atomic.Int32
		cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
			w := watch.NewFake()
			if watches.Add(1) <= 1000 { // beyond, the watch lasts: a loop that never waits ends
				w.Stop()
			}
			return true, w, nil
		})
		pool := newDiscoveryPool(t)
		runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{})
		time.Sleep(time.Minute)
		synctest.Wait()
		// Backoffs of 1, 2, 4, 8, 16 and 30s (±20%) before each list.
		assert.LessOrEqual(t, watches.Load(), int32(8), "watches in a minute")
		assert.Equal(t, []string{"10.0.0.1:6443"}, discovered(pool), "the lists still apply")
	})
}

// The backoff starts over once a watch has worked for a while: a watch
// that fails after a minute is followed by a list a second later, not
// by the 30s that earlier failures (here five lists at start) reached.
func TestDiscoveryBackoffStartsOverAfterAWatchThatWorked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeSlice("kubernetes", true, "10.0.0.1"))
		var mu sync.Mutex
		var lists []time.Time
		cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			lists = append(lists, time.Now())
			if len(lists) <= 5 {
				return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
			}
			return false, nil, nil
		})
		watchers := make(chan *watch.FakeWatcher, 10)
		cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
			w := watch.NewFake()
			watchers <- w
			return true, w, nil
		})
		pool := newDiscoveryPool(t)
		runDiscoverer(t, cs, pool, endpoint.DiscovererOptions{})
		w := <-watchers
		time.Sleep(time.Minute)
		w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError, Message: "watch broke"})
		failed := time.Now()
		<-watchers
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, lists, 7)
		assert.Less(t, lists[6].Sub(failed), 2*time.Second, "the list after a watch that worked for a minute")
	})
}
