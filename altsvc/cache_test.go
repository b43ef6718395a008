package altsvc_test

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

var (
	t0     = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	origin = altsvc.Origin{Scheme: "https", Host: "api.example", Port: 6443}
)

// entry returns the Entry for a expiring at t0 + after.
func entry(a altsvc.Alternative, after time.Duration) altsvc.Entry {
	return altsvc.Entry{Alternative: a, Expires: t0.Add(after)}
}

func mustParse(t testing.TB, s string) altsvc.Value {
	t.Helper()
	v, err := altsvc.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCacheExpiry(t *testing.T) {
	tests := []struct {
		name   string
		maxTTL time.Duration
		header string
		age    time.Duration
		want   []altsvc.Entry // at t0
	}{
		{"default ma capped", 0, `h2=":1"`, 0, []altsvc.Entry{entry(alt("h2", "", 1), 70*time.Second)}},
		{"ma below cap", 0, `h2=":1"; ma=60`, 0, []altsvc.Entry{entry(ma(alt("h2", "", 1), 60), 60*time.Second)}},
		{"ma minus age", 0, `h2=":1"; ma=60`, 10 * time.Second, []altsvc.Entry{entry(ma(alt("h2", "", 1), 60), 50*time.Second)}},
		{"ma minus age capped", 0, `h2=":1"; ma=3600`, 10 * time.Second, []altsvc.Entry{entry(ma(alt("h2", "", 1), 3600), 70*time.Second)}},
		{"ma equals age dropped", 0, `h2=":1"; ma=30`, 30 * time.Second, nil},
		{"ma below age dropped", 0, `h2=":1"; ma=30`, time.Hour, nil},
		{"ma zero dropped", 0, `h2=":1"; ma=0`, 0, nil},
		{"negative age is zero", 0, `h2=":1"; ma=60`, -time.Hour, []altsvc.Entry{entry(ma(alt("h2", "", 1), 60), 60*time.Second)}},
		{"custom cap", 10 * time.Second, `h2=":1"; ma=60`, 0, []altsvc.Entry{entry(ma(alt("h2", "", 1), 60), 10*time.Second)}},
		{"no cap", -1, `h2=":1"; ma=3600`, 600 * time.Second, []altsvc.Entry{entry(ma(alt("h2", "", 1), 3600), 3000*time.Second)}},
		{"stale one dropped, fresh one kept", 0, `h2=":1"; ma=5, h2=":2"; ma=50`, 10 * time.Second,
			[]altsvc.Entry{entry(ma(alt("h2", "", 2), 50), 40*time.Second)}},
		{"duplicates removed, first kept", 0, `h2=":1"; ma=5, h2=":1"; ma=50, h3=":1"`, 0,
			[]altsvc.Entry{entry(ma(alt("h2", "", 1), 5), 5*time.Second), entry(alt("h3", "", 1), 70*time.Second)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := altsvc.NewCache(altsvc.CacheConfig{MaxTTL: tt.maxTTL})
			c.Update(origin, t0, mustParse(t, tt.header), tt.age)
			if got := c.Get(origin, t0); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Get\n got %+v\nwant %+v", got, tt.want)
			}
			wantLen := 0
			if tt.want != nil {
				wantLen = 1
			}
			if got := c.Len(); got != wantLen {
				t.Errorf("Len = %d, want %d", got, wantLen)
			}
		})
	}
}

func TestCacheLazyExpiry(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{})
	c.Update(origin, t0, mustParse(t, `h2=":1"; ma=10, h2=":2"; ma=20`), 0)

	steps := []struct {
		after time.Duration
		ports []int
		len   int
	}{
		{0, []int{1, 2}, 1},
		{9 * time.Second, []int{1, 2}, 1},
		{10 * time.Second, []int{2}, 1}, // expiry is exclusive
		{19 * time.Second, []int{2}, 1},
		{20 * time.Second, nil, 0}, // the origin is dropped when nothing is left
		{time.Hour, nil, 0},
	}
	for _, s := range steps {
		got := c.Get(origin, t0.Add(s.after))
		var ports []int
		for _, e := range got {
			ports = append(ports, e.Port)
		}
		if !reflect.DeepEqual(ports, s.ports) || c.Len() != s.len {
			t.Errorf("at +%v: ports %v, Len %d; want %v, %d", s.after, ports, c.Len(), s.ports, s.len)
		}
	}
}

func TestCacheClearAndReplace(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{})
	other := altsvc.Origin{Scheme: "https", Host: "other.example", Port: 443}
	c.Update(origin, t0, mustParse(t, `h2="a.example:1", h2="b.example:1"`), 0)
	c.Update(other, t0, mustParse(t, `h2=":9"`), 0)

	t.Run("replace", func(t *testing.T) {
		c.Update(origin, t0.Add(time.Second), mustParse(t, `h2="c.example:1"`), 0)
		want := []altsvc.Entry{{Alternative: alt("h2", "c.example", 1), Expires: t0.Add(71 * time.Second)}}
		if got := c.Get(origin, t0.Add(time.Second)); !reflect.DeepEqual(got, want) {
			t.Errorf("after replace: %+v, want %+v", got, want)
		}
	})
	t.Run("replace with all stale removes", func(t *testing.T) {
		c.Update(origin, t0, mustParse(t, `h2="d.example:1"; ma=1`), time.Minute)
		if got := c.Get(origin, t0); got != nil {
			t.Errorf("after stale replace: %+v, want nil", got)
		}
	})
	t.Run("clear", func(t *testing.T) {
		c.Update(origin, t0, mustParse(t, `h2=":1"`), 0)
		c.Update(origin, t0, mustParse(t, `clear`), 0)
		if got := c.Get(origin, t0); got != nil {
			t.Errorf("after clear: %+v, want nil", got)
		}
	})
	t.Run("empty value removes", func(t *testing.T) {
		c.Update(origin, t0, mustParse(t, `h2=":1"`), 0)
		c.Update(origin, t0, altsvc.Value{}, 0)
		if got := c.Get(origin, t0); got != nil {
			t.Errorf("after empty value: %+v, want nil", got)
		}
	})
	t.Run("other origin untouched", func(t *testing.T) {
		if got := c.Get(other, t0); len(got) != 1 || got[0].Port != 9 {
			t.Errorf("other origin: %+v", got)
		}
	})
	t.Run("remove and purge", func(t *testing.T) {
		c.Update(origin, t0, mustParse(t, `h2=":1"`), 0)
		c.Remove(other)
		if got := c.Get(other, t0); got != nil || c.Len() != 1 {
			t.Errorf("after Remove: %+v, Len %d", got, c.Len())
		}
		c.Purge()
		if c.Len() != 0 {
			t.Errorf("after Purge: Len %d", c.Len())
		}
	})
}

func TestCacheLRU(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{Size: 2})
	o := func(i int) altsvc.Origin { return altsvc.Origin{Scheme: "https", Host: "o.example", Port: i} }
	v := mustParse(t, `h2=":443"`)
	c.Update(o(1), t0, v, 0)
	c.Update(o(2), t0, v, 0)
	c.Get(o(1), t0) // o(1) is now more recently used than o(2)
	c.Update(o(3), t0, v, 0)
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
	for i, want := range map[int]bool{1: true, 2: false, 3: true} {
		if got := c.Get(o(i), t0) != nil; got != want {
			t.Errorf("origin %d present = %v, want %v", i, got, want)
		}
	}
}

func TestCacheDefaultSize(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{Size: -1})
	v := mustParse(t, `h2=":443"`)
	for i := range altsvc.DefaultCacheSize + 10 {
		c.Update(altsvc.Origin{Scheme: "https", Host: "o.example", Port: i + 1}, t0, v, 0)
	}
	if c.Len() != altsvc.DefaultCacheSize {
		t.Errorf("Len = %d, want %d", c.Len(), altsvc.DefaultCacheSize)
	}
}

func TestCacheBoundsAlternatives(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{})
	var v altsvc.Value
	for i := range 2 * altsvc.MaxAlternatives {
		v.Alternatives = append(v.Alternatives, alt("h2", "", i+1))
	}
	c.Update(origin, t0, v, 0)
	got := c.Get(origin, t0)
	if len(got) != altsvc.MaxAlternatives || got[0].Port != 1 || got[len(got)-1].Port != altsvc.MaxAlternatives {
		t.Errorf("kept %d alternatives (%+v), want the first %d", len(got), got, altsvc.MaxAlternatives)
	}
}

func TestCacheIsolation(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{})
	v := mustParse(t, `h2=":1", h2=":2"; ma=10`)
	c.Update(origin, t0, v, 0)
	v.Alternatives[0].Port = 99 // Update keeps no reference

	got := c.Get(origin, t0)
	got[0].Port = 98 // the result is the caller's
	got = c.Get(origin, t0.Add(15*time.Second))
	got[0].Port = 97 // also after lazy expiry rewrote the entry
	if got := c.Get(origin, t0.Add(15*time.Second)); len(got) != 1 || got[0].Port != 1 {
		t.Errorf("Get = %+v, want port 1 only", got)
	}
}

// TestCacheSynctest runs the cache on the fake clock of a synctest bubble:
// a simulated 70 s pass at once, and the bubble would fail if the cache left
// a goroutine behind.
func TestCacheSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := altsvc.NewCache(altsvc.CacheConfig{})
		c.Update(origin, time.Now(), mustParse(t, `h2=":443"; ma=3600`), 0)
		time.Sleep(altsvc.DefaultMaxTTL - time.Second)
		if got := c.Get(origin, time.Now()); len(got) != 1 {
			t.Fatalf("before the cap: %+v", got)
		}
		time.Sleep(time.Second)
		if got := c.Get(origin, time.Now()); got != nil {
			t.Fatalf("after the cap: %+v", got)
		}
	})
}

// TestCacheConcurrent hammers one cache from several goroutines; run with
// -race.
func TestCacheConcurrent(t *testing.T) {
	c := altsvc.NewCache(altsvc.CacheConfig{Size: 4})
	v := mustParse(t, `h2=":1"; ma=5, h2=":2"; ma=60`)
	const workers, rounds = 8, 500
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				o := altsvc.Origin{Scheme: "https", Host: "o.example", Port: (w + i) % 6}
				now := t0.Add(time.Duration(i%20) * time.Second)
				switch i % 4 {
				case 0:
					c.Update(o, now, v, 0)
				case 1:
					c.Update(o, now, altsvc.Value{Clear: true}, 0)
				default:
					for _, e := range c.Get(o, now) {
						if !now.Before(e.Expires) {
							errs <- fmt.Errorf("Get at %v returned expired %+v", now, e)
							return
						}
					}
				}
				if n := c.Len(); n > 4 {
					errs <- fmt.Errorf("Len = %d, above the size 4", n)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
