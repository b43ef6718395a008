package upstream_test

import (
	"errors"
	"fmt"

	"github.com/apifailover/apifailover/transport/upstream"
)

func ExamplePool() {
	p, err := upstream.New(upstream.Config{
		// Only for a reproducible example: by default the addresses of
		// this host's interfaces count as local.
		IsLocal: func(host string) bool { return false },
	})
	if err != nil {
		panic(err)
	}
	p.Subscribe(func(e upstream.Event) {
		if e.Kind == upstream.EventDown {
			fmt.Println("event:", e.Kind, e.Addr, e.Err)
		}
	})

	// Invalid entries are reported; the valid ones are used.
	err = p.Set(upstream.SourceStatic, []upstream.Spec{
		{Addr: "10.0.0.1:6443"},
		{Addr: "10.0.0.2:6443"},
		{Addr: "API.Example.COM.:6443"},
		{Addr: "10.0.0.4"},
	})
	fmt.Println("set:", err)

	// Passive signals from real traffic.
	p.ReportSuccess("10.0.0.2:6443")
	p.ReportFailure("10.0.0.1:6443", upstream.FailureDial, errors.New("connection refused"))

	fmt.Println("candidates:", p.Candidates())
	first, _ := p.Pick()
	fmt.Println("pick:", first)
	for _, s := range p.Status() {
		fmt.Printf("%s %s preferred=%v err=%q\n", s.Addr, s.State, s.Preferred, s.LastError)
	}
	// Output:
	// set: invalid endpoint "10.0.0.4": missing port in address (want host:port with an IPv4 address, a bracketed IPv6 address or a DNS name, and a port 1-65535)
	// event: down 10.0.0.1:6443 connection refused
	// candidates: [10.0.0.2:6443 api.example.com:6443 10.0.0.1:6443]
	// pick: 10.0.0.2:6443
	// 10.0.0.2:6443 healthy preferred=true err=""
	// api.example.com:6443 unknown preferred=false err=""
	// 10.0.0.1:6443 unhealthy preferred=false err="connection refused"
}

func ExampleParseAddr() {
	for _, in := range []string{"[::ffff:10.0.0.1]:6443", "[FE80::1%eth0]:443", "Kube.Example.:6443", "10.0.0.1:0"} {
		addr, err := upstream.ParseAddr(in)
		fmt.Printf("%q %v\n", addr, err)
	}
	// Output:
	// "10.0.0.1:6443" <nil>
	// "[fe80::1%eth0]:443" <nil>
	// "kube.example:6443" <nil>
	// "" invalid endpoint "10.0.0.1:0": port "0" is not a number in 1-65535 (want host:port with an IPv4 address, a bracketed IPv6 address or a DNS name, and a port 1-65535)
}
