package upstream_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/apifailover/apifailover/transport/upstream"
)

var benchSizes = []int{3, 100, 1000}

// benchPool returns a pool of n healthy endpoints and their addresses.
func benchPool(b *testing.B, n int) (*upstream.Pool, []string) {
	b.Helper()
	p := newPool(b, upstream.Config{})
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.%d.%d:6443", i/250, i%250+1)
	}
	mustSet(b, p, upstream.SourceDiscovery, specs(addrs...))
	for _, a := range addrs {
		p.ReportSuccess(a)
	}
	if p.Len() != n {
		b.Fatalf("pool has %d endpoints, want %d", p.Len(), n)
	}
	return p, addrs
}

func BenchmarkPick(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p, _ := benchPool(b, n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Pick(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPickParallel(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p, _ := benchPool(b, n)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, _ = p.Pick()
				}
			})
		})
	}
}

func BenchmarkCandidates(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p, _ := benchPool(b, n)
			b.ReportAllocs()
			for b.Loop() {
				if c := p.Candidates(); len(c) != n {
					b.Fatalf("%d candidates", len(c))
				}
			}
		})
	}
}

// BenchmarkObserve is the cost of a passive success on the hot path: one
// endpoint of 1000, already healthy, so the order does not change.
func BenchmarkObserve(b *testing.B) {
	p, addrs := benchPool(b, 1000)
	a := addrs[500]
	b.ReportAllocs()
	for b.Loop() {
		p.ReportSuccess(a)
	}
}

// BenchmarkObserveFlap is the worst case: every report changes the health
// class of one endpoint of n (healthy <-> suspect), so the order is rebuilt.
func BenchmarkObserveFlap(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p, addrs := benchPool(b, n)
			a := addrs[n/2]
			b.ReportAllocs()
			for b.Loop() {
				p.ReportFailure(a, upstream.FailureConnLost, nil)
				p.ReportSuccess(a)
			}
		})
	}
}
