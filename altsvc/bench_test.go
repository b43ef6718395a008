package altsvc_test

import (
	"testing"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

var benchHeaders = []struct {
	name string
	in   string
}{
	{"one", `h2=":443"`},
	{"three with ma", `h2="10.0.0.1:6443"; ma=60, h2="10.0.0.2:6443"; ma=60, h2="[fd00::3]:6443"; ma=60; persist=1`},
	{"clear", `clear`},
}

// sinkValue keeps results alive so the compiler cannot drop the work.
var sinkValue altsvc.Value

func BenchmarkParse(b *testing.B) {
	for _, bb := range benchHeaders {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.in)))
			for b.Loop() {
				v, err := altsvc.Parse(bb.in)
				if err != nil {
					b.Fatal(err)
				}
				sinkValue = v
			}
		})
	}
}

func BenchmarkFormat(b *testing.B) {
	for _, bb := range benchHeaders {
		v := mustParse(b, bb.in)
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := altsvc.Format(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCache(b *testing.B) {
	c := altsvc.NewCache(altsvc.CacheConfig{})
	v := mustParse(b, benchHeaders[1].in)
	o := altsvc.Origin{Scheme: "https", Host: "api.example", Port: 6443}
	b.Run("update", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Update(o, t0, v, 0)
		}
	})
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		c.Update(o, t0, v, 0)
		for b.Loop() {
			if len(c.Get(o, t0.Add(time.Second))) != 3 {
				b.Fatal("missing alternatives")
			}
		}
	})
}
