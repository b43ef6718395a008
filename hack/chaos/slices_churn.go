package chaos

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// EndpointSlice churn: every churnEvery the soak creates, updates or
// deletes one of its own EndpointSlices in default, labelled for the
// kubernetes Service as the apiservers' own slice is, so that both
// paths' discovery reads them: one of FQDN addresses, one of IPv6
// addresses, an empty one, one of not-ready endpoints, one listing the
// apiservers' addresses and a made-up one several times, and one of
// manySliceAddrs addresses. The made-up addresses route nowhere in the
// bed's network namespace. Every churnCheck both pools are checked: each
// apiserver the kubernetes slice lists Ready is in the pool as discovered
// (the kubernetes slice comes first within the bound) within discoveryLag,
// and the pool holds at most endpoint.MaxDiscoveredEndpoints plus the
// static endpoints. An
// apiserver the slice does not list may be absent: transport.Wrap's only
// static endpoint is the origin (apiserver-1), and an apiserver stopped by
// a fault leaves the slice. The slices are removed before the all-down phase
// (the bed's Heal waits for the ready endpoints to be exactly the
// apiservers) and at the end, after which the made-up addresses must
// leave both pools within churnSettle.
const (
	churnEvery     = 2 * time.Second
	churnCheck     = 3 * time.Second
	churnSettle    = 30 * time.Second
	manySliceAddrs = 1000
	churnPrefix    = "chaos-"
	// churnPauseBefore and churnPauseAfter bound the pause around the
	// all-down phase.
	churnPauseBefore = 8 * time.Second
	churnPauseAfter  = 20 * time.Second
	// discoveryLag is how long a pool's discovered endpoints may miss an
	// apiserver the kubernetes slice lists Ready, the slice unchanged: a
	// watch broken by a fault comes back after its backoff (up to 30s),
	// and a discovery that fell back to polling the kubernetes Endpoints
	// (after a 403 to its slice watch, which a restarting apiserver
	// answers until its authorizer has synced) reads it every 10s; each
	// with a request of up to 10s.
	discoveryLag = 45 * time.Second
)

// churnKinds are the slices' kinds, written in turn.
var churnKinds = []string{"fqdn", "ipv6", "empty", "notready", "duplicate", "many"}

// SliceReport is the churn's figures.
type SliceReport struct {
	// Writes by action and result ("create ok", "delete error", ...):
	// they go through transport.Wrap and may fail in fault windows.
	Writes map[string]int `json:"writes"`
	// Checks of both pools, and the largest pool seen and its bound.
	Checks       int `json:"checks"`
	MaxPool      int `json:"max_pool"`
	PoolBound    int `json:"pool_bound"`
	MaxFakeInUse int `json:"max_made_up_in_pool"`
	// MaxFakeByPath is MaxFakeInUse per path: localproxy's discovery
	// reads the kubernetes Endpoints instead of the slices while it has
	// fallen back to them, and sees no made-up address then.
	MaxFakeByPath map[string]int `json:"max_made_up_by_path"`
	// Absent: apiservers absent from a pool at a check, whatever the
	// kubernetes slice said (a figure: see above). LongestUndiscovered:
	// the longest an apiserver the kubernetes slice listed Ready (the
	// slice unchanged) was missing from a pool's discovered endpoints, in
	// seconds; Undiscovered: checks at which that had lasted longer than
	// discoveryLag (an invariant), and the first few of them.
	LongestUndiscovered float64  `json:"longest_undiscovered_s"`
	Absent              int      `json:"absent"`
	Undiscovered        int      `json:"undiscovered"`
	UndiscoveredFirst   []string `json:"undiscovered_first,omitempty"`
	// Settled: seconds after the slices were removed until both pools
	// held no made-up address (or churnSettle); Leftover: made-up
	// addresses still there then.
	Settled  float64 `json:"settled_s"`
	Leftover int     `json:"leftover"`
}

// miss is an apiserver missing from a pool's discovered endpoints since
// a check, the kubernetes slice at resourceVersion rv.
type miss struct {
	since time.Time
	rv    string
}

// pathPool is a path's pool, as its Status lists it (localproxy's as the
// serving instance's last /status lists it).
type pathPool struct {
	path   string
	status func() []upstream.Status
}

// madeUp reports whether addr is one of the churn's made-up addresses.
func madeUp(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.HasSuffix(host, ".invalid") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	for _, p := range madeUpPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// madeUpPrefixes hold the churn's made-up IP addresses.
var madeUpPrefixes = []netip.Prefix{
	netip.MustParsePrefix("10.251.0.0/16"),
	netip.MustParsePrefix("10.252.0.0/16"),
	netip.MustParsePrefix("fd00::/16"),
}

// churn writes the slices and checks the pools.
type churn struct {
	cs     kubernetes.Interface
	pools  []pathPool
	real   map[string]bool // the apiservers' addresses
	began  time.Time
	pauses [][2]time.Time
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex // guards rep and misses
	rep     SliceReport
	misses  map[string]miss // by path/addr: missing since, with the kubernetes slice at
	present map[string]bool // slices that exist
}

// startChurn starts writing slices through cs and checking pools, pausing
// around every all-down step of plan (times from began).
func startChurn(ctx context.Context, cs kubernetes.Interface, bed *testbed.Bed, pools []pathPool, plan []Step, began time.Time) *churn {
	c := &churn{cs: cs, pools: pools, real: map[string]bool{}, began: began, done: make(chan struct{}),
		rep:    SliceReport{Writes: map[string]int{}, MaxFakeByPath: map[string]int{}, PoolBound: endpoint.MaxDiscoveredEndpoints + len(bed.APIServers())},
		misses: map[string]miss{}, present: map[string]bool{}}
	for _, s := range bed.APIServers() {
		c.real[s.Addr()] = true
	}
	for _, st := range plan {
		if st.Kind == AllDown {
			c.pauses = append(c.pauses, [2]time.Time{began.Add(st.At - churnPauseBefore), began.Add(st.End() + churnPauseAfter)})
		}
	}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		c.run(ctx)
	}()
	return c
}

func (c *churn) paused(t time.Time) bool {
	for _, p := range c.pauses {
		if !t.Before(p[0]) && t.Before(p[1]) {
			return true
		}
	}
	return false
}

func (c *churn) run(ctx context.Context) {
	write := time.NewTicker(churnEvery)
	defer write.Stop()
	check := time.NewTicker(churnCheck)
	defer check.Stop()
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			c.check(ctx)
		case now := <-write.C:
			if c.paused(now) {
				c.removeAll(ctx)
				continue
			}
			kind := churnKinds[i%len(churnKinds)]
			switch (i / len(churnKinds)) % 3 {
			case 0:
				c.write(ctx, kind, 0)
			case 1:
				c.write(ctx, kind, 1)
			default:
				c.remove(ctx, kind)
			}
			i++
		}
	}
}

// slice returns the slice of kind; version changes its addresses.
func (c *churn) slice(kind string, version int) *discoveryv1.EndpointSlice {
	port, name := int32(testbed.APIServerPort), "https"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: churnPrefix + kind, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	ep := func(ready bool, addrs ...string) discoveryv1.Endpoint {
		r := ready
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: &r}}
	}
	v := strconv.Itoa(version + 1)
	switch kind {
	case "fqdn":
		s.AddressType = discoveryv1.AddressTypeFQDN
		s.Endpoints = []discoveryv1.Endpoint{ep(true, "apiserver-"+v+".chaos.invalid"), ep(true, "x"+v+".example.invalid")}
	case "ipv6":
		s.AddressType = discoveryv1.AddressTypeIPv6
		s.Endpoints = []discoveryv1.Endpoint{ep(true, "fd00:250::"+v), ep(true, "fd00:251::1")}
	case "empty":
		s.Endpoints = []discoveryv1.Endpoint{}
	case "notready":
		s.Endpoints = []discoveryv1.Endpoint{ep(false, "10.251.0."+v), ep(false, "10.251.1."+v)}
	case "duplicate":
		var addrs []string
		for a := range c.real {
			h, _, _ := net.SplitHostPort(a)
			addrs = append(addrs, h)
		}
		slices.Sort(addrs)
		s.Endpoints = []discoveryv1.Endpoint{ep(true, addrs...), ep(true, addrs...), ep(true, "10.251.2."+v), ep(true, "10.251.2."+v)}
	case "many":
		s.Endpoints = make([]discoveryv1.Endpoint, manySliceAddrs)
		for i := range s.Endpoints {
			s.Endpoints[i] = ep(true, fmt.Sprintf("10.252.%d.%d", (i/250)+4*version, i%250+1))
		}
	}
	return s
}

func (c *churn) note(what string, err error) {
	res := "ok"
	if err != nil {
		res = "error"
	}
	c.mu.Lock()
	c.rep.Writes[what+" "+res]++
	c.mu.Unlock()
}

func (c *churn) write(ctx context.Context, kind string, version int) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s := c.slice(kind, version)
	api := c.cs.DiscoveryV1().EndpointSlices("default")
	cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
		c.note("create", err)
	case err != nil:
		c.note("get", err)
		return
	default:
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
		c.note("update", err)
	}
	if err == nil {
		c.mu.Lock()
		c.present[kind] = true
		c.mu.Unlock()
	}
}

func (c *churn) remove(ctx context.Context, kind string) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err := c.cs.DiscoveryV1().EndpointSlices("default").Delete(ctx, churnPrefix+kind, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	c.note("delete", err)
	if err == nil {
		c.mu.Lock()
		delete(c.present, kind)
		c.mu.Unlock()
	}
}

// removeAll deletes every slice the churn may have made.
func (c *churn) removeAll(ctx context.Context) bool {
	ok := true
	for _, kind := range churnKinds {
		c.mu.Lock()
		present := c.present[kind]
		c.mu.Unlock()
		if present {
			c.remove(ctx, kind)
		}
		c.mu.Lock()
		ok = ok && !c.present[kind]
		c.mu.Unlock()
	}
	return ok
}

// check looks at both pools.
func (c *churn) check(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var listed []string // Ready in the kubernetes slice
	rv := ""
	if ks, err := c.cs.DiscoveryV1().EndpointSlices("default").Get(rctx, "kubernetes", metav1.GetOptions{}); err == nil {
		rv = ks.ResourceVersion
		for _, sp := range endpoint.SlicesToSpecs(ks) {
			listed = append(listed, sp.Addr)
		}
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rep.Checks++
	for _, pp := range c.pools {
		st := pp.status()
		c.rep.MaxPool = max(c.rep.MaxPool, len(st))
		discovered := map[string]bool{}
		in := map[string]bool{}
		fake := 0
		for _, s := range st {
			in[s.Addr] = true
			if s.Sources&upstream.SourceDiscovery != 0 {
				discovered[s.Addr] = true
			}
			if madeUp(s.Addr) {
				fake++
			}
		}
		c.rep.MaxFakeInUse = max(c.rep.MaxFakeInUse, fake)
		c.rep.MaxFakeByPath[pp.path] = max(c.rep.MaxFakeByPath[pp.path], fake)
		for a := range c.real {
			if !in[a] {
				c.rep.Absent++
			}
		}
		for _, a := range listed {
			key := pp.path + "/" + a
			if discovered[a] {
				delete(c.misses, key)
				continue
			}
			m, ok := c.misses[key]
			if !ok || m.rv != rv || rv == "" {
				c.misses[key] = miss{since: now, rv: rv}
				continue
			}
			d := now.Sub(m.since)
			c.rep.LongestUndiscovered = max(c.rep.LongestUndiscovered, d.Seconds())
			if d > discoveryLag {
				c.rep.Undiscovered++
				if len(c.rep.UndiscoveredFirst) < 10 {
					c.rep.UndiscoveredFirst = append(c.rep.UndiscoveredFirst, fmt.Sprintf("%.1fs %s for %.0fs (in the pool: %v)", now.Sub(c.began).Seconds(), key, d.Seconds(), in[a]))
				}
			}
		}
	}
}

// finish stops the churn, removes the slices and waits for the made-up
// addresses to leave both pools; it returns the report and the violated
// invariants.
func (c *churn) finish(ctx context.Context) (SliceReport, []string) {
	c.cancel()
	<-c.done
	deadline := time.Now().Add(churnSettle)
	for !c.removeAll(ctx) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Second)
	}
	removed := time.Now()
	leftover := 0
	for {
		leftover = 0
		for _, pp := range c.pools {
			for _, s := range pp.status() {
				if madeUp(s.Addr) {
					leftover++
				}
			}
		}
		if leftover == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.rep
	r.Writes = maps.Clone(c.rep.Writes)
	r.Settled, r.Leftover = time.Since(removed).Seconds(), leftover
	var v []string
	if r.MaxPool > r.PoolBound {
		v = append(v, fmt.Sprintf("slices: a pool held %d endpoints, above the bound %d", r.MaxPool, r.PoolBound))
	}
	if r.Undiscovered > 0 {
		v = append(v, fmt.Sprintf("slices: an apiserver listed Ready by the kubernetes slice (unchanged) was missing from a pool's discovered endpoints for more than %s at %d checks: %v", discoveryLag, r.Undiscovered, r.UndiscoveredFirst))
	}
	if r.Leftover > 0 {
		v = append(v, fmt.Sprintf("slices: %d made-up addresses still in the pools %.0fs after the slices were removed", r.Leftover, r.Settled))
	}
	r.MaxFakeByPath = maps.Clone(c.rep.MaxFakeByPath)
	if r.MaxFakeInUse == 0 {
		v = append(v, "slices: no made-up address ever reached a pool: the churn tested nothing")
	}
	return r, v
}
