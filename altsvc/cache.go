package altsvc

import (
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

const (
	// DefaultCacheSize is the number of origins a [Cache] keeps by default.
	DefaultCacheSize = 64

	// DefaultMaxTTL is the default cap on how long a [Cache] keeps an
	// alternative, whatever its "ma": kube-apiserver's default shutdown
	// window, so that an alternative learned from a server that then shuts
	// down does not outlive it by much.
	DefaultMaxTTL = 70 * time.Second
)

// Origin is the key of a [Cache]: the origin (RFC 6454) that advertised the
// alternatives. Callers should normalise it (lower-case scheme and host, IPv6
// without brackets, explicit default port) so one origin has one key.
type Origin struct {
	Scheme string
	Host   string
	Port   int
}

// Entry is an alternative held by a [Cache], with the time it stops being
// used.
type Entry struct {
	Alternative
	// Expires is when the alternative expires: the Update time plus
	// min(MaxAge − Age, the cache's MaxTTL).
	Expires time.Time
}

// CacheConfig configures a [Cache]. The zero value is ready to use.
type CacheConfig struct {
	// Size is the most origins kept; adding one more evicts the least
	// recently used. If zero or negative, DefaultCacheSize is used.
	Size int
	// MaxTTL caps how long an alternative is kept after an Update. If zero,
	// DefaultMaxTTL is used. If negative, there is no cap and only "ma"
	// minus Age counts.
	MaxTTL time.Duration
}

// Cache holds the alternatives learned from Alt-Svc fields, per origin. It is
// bounded in origins (least recently used evicted) and in alternatives per
// origin ([MaxAlternatives]). Expiry is checked lazily: [Cache.Get] returns
// only unexpired alternatives and drops expired ones. Time is passed in by
// the caller; the cache starts no goroutines and needs no Close.
//
// A Cache is safe for concurrent use.
type Cache struct {
	// mu guards core. It is innermost: the cache calls out to nothing
	// while holding it, and Learner takes it only with its own lock
	// released.
	mu   sync.Mutex
	core cache
}

// NewCache returns an empty cache configured by cfg.
func NewCache(cfg CacheConfig) *Cache {
	return &Cache{core: newCache(cfg)}
}

// Update records the Alt-Svc field value v received from origin at now, in a
// response whose Age header said age (zero without one; negative counts as
// zero). A "clear" value, or one without alternatives, removes the origin's
// alternatives. Otherwise v replaces them: each alternative is kept until
// now + min(MaxAge − age, MaxTTL); one with MaxAge ≤ age is already stale and
// dropped. Only the first [MaxAlternatives] alternatives are kept, and of
// several with the same protocol, host and port only the first.
//
// Update keeps no reference to v.Alternatives.
func (c *Cache) Update(origin Origin, now time.Time, v Value, age time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.core.update(origin, now, v, age)
}

// Get returns the alternatives of origin that have not expired at now, in
// the server's order of preference, or nil. It drops expired ones and marks
// the origin as recently used. The returned slice is the caller's.
func (c *Cache) Get(origin Origin, now time.Time) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.get(origin, now)
}

// Remove forgets the alternatives of origin.
func (c *Cache) Remove(origin Origin) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.core.lru.Remove(origin)
}

// Purge forgets all alternatives.
func (c *Cache) Purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.core.lru.Purge()
}

// Len returns the number of origins held, including any whose alternatives
// have all expired but have not been looked up since.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.lru.Len()
}

// cache is the unlocked core of [Cache]. simplelru.LRU is the unlocked core
// of lru.Cache; the lazy expiry in get is a read-modify-write that must be
// atomic as a whole, so Cache holds one lock around both rather than
// lru.Cache's lock per call.
type cache struct {
	lru    *simplelru.LRU[Origin, []Entry] // stored slices are never modified
	maxTTL time.Duration                   // negative: no cap
}

func newCache(cfg CacheConfig) cache {
	size := cfg.Size
	if size <= 0 {
		size = DefaultCacheSize
	}
	maxTTL := cfg.MaxTTL
	if maxTTL == 0 {
		maxTTL = DefaultMaxTTL
	}
	l, err := simplelru.NewLRU[Origin, []Entry](size, nil)
	if err != nil {
		// Only for size <= 0, excluded above.
		panic("altsvc: " + err.Error())
	}
	return cache{lru: l, maxTTL: maxTTL}
}

func (c *cache) update(origin Origin, now time.Time, v Value, age time.Duration) {
	age = max(age, 0)
	alts := v.Alternatives
	if v.Clear {
		alts = nil
	}
	alts = alts[:min(len(alts), MaxAlternatives)]
	var entries []Entry
	for _, a := range alts {
		ttl := a.MaxAge - age
		if ttl <= 0 {
			continue
		}
		if c.maxTTL >= 0 {
			ttl = min(ttl, c.maxTTL)
		}
		if slices.ContainsFunc(entries, func(e Entry) bool {
			return e.Protocol == a.Protocol && e.Host == a.Host && e.Port == a.Port
		}) {
			continue
		}
		if entries == nil {
			entries = make([]Entry, 0, len(alts))
		}
		entries = append(entries, Entry{Alternative: a, Expires: now.Add(ttl)})
	}
	if len(entries) == 0 {
		c.lru.Remove(origin)
		return
	}
	c.lru.Add(origin, entries)
}

func (c *cache) get(origin Origin, now time.Time) []Entry {
	entries, ok := c.lru.Get(origin)
	if !ok {
		return nil
	}
	live := 0
	for _, e := range entries {
		if now.Before(e.Expires) {
			live++
		}
	}
	if live == 0 {
		c.lru.Remove(origin)
		return nil
	}
	out := make([]Entry, 0, live)
	for _, e := range entries {
		if now.Before(e.Expires) {
			out = append(out, e)
		}
	}
	if live < len(entries) {
		// Store a copy: out is the caller's.
		c.lru.Add(origin, slices.Clone(out))
	}
	return out
}
