package altsvc_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

func ExampleParse() {
	v, err := altsvc.Parse(`h2="[2001:db8::1]:443"; ma=3600; persist=1, http%2F1.1=":80"`)
	if err != nil {
		panic(err)
	}
	for _, a := range v.Alternatives {
		fmt.Printf("%s host=%q port=%d ma=%v persist=%v\n", a.Protocol, a.Host, a.Port, a.MaxAge, a.Persist)
	}

	_, err = altsvc.Parse(`h2=":0"`)
	fmt.Println(err)
	fmt.Println(errors.Is(err, altsvc.ErrSyntax))
	// Output:
	// h2 host="2001:db8::1" port=443 ma=1h0m0s persist=true
	// http/1.1 host="" port=80 ma=24h0m0s persist=false
	// altsvc: parsing "h2=\":0\"": port out of range at offset 5 (at "0\"")
	// true
}

func ExampleFormat() {
	s, err := altsvc.Format(altsvc.Value{Alternatives: []altsvc.Alternative{
		{Protocol: "h2", Host: "10.0.0.1", Port: 6443, MaxAge: 60 * time.Second},
		{Protocol: "h2", Host: "Api.Example", Port: 6443, MaxAge: altsvc.DefaultMaxAge},
	}})
	fmt.Println(s, err)
	// Output:
	// h2="10.0.0.1:6443";ma=60,h2="api.example:6443" <nil>
}

func ExampleCache() {
	c := altsvc.NewCache(altsvc.CacheConfig{}) // 64 origins, entries capped at 70 s
	origin := altsvc.Origin{Scheme: "https", Host: "api.example", Port: 6443}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

	// A response with "Age: 20" carrying two alternatives.
	v, _ := altsvc.ParseHeader([]string{`h2="10.0.0.1:6443"; ma=30`, `h2="10.0.0.2:6443"; ma=3600`})
	c.Update(origin, now, v, 20*time.Second)

	for _, after := range []time.Duration{0, 15 * time.Second, 75 * time.Second} {
		fmt.Printf("+%v:", after)
		for _, e := range c.Get(origin, now.Add(after)) {
			fmt.Printf(" %s:%d (expires +%v)", e.Host, e.Port, e.Expires.Sub(now))
		}
		fmt.Println()
	}
	// Output:
	// +0s: 10.0.0.1:6443 (expires +10s) 10.0.0.2:6443 (expires +1m10s)
	// +15s: 10.0.0.2:6443 (expires +1m10s)
	// +1m15s:
}
