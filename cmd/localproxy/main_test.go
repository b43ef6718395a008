package main_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
)

// files are inputs for the validation tests.
type files struct {
	ca, notPEM, kubeconfig, missing string
	// insecure is a kubeconfig with insecure-skip-tls-verify.
	insecure string
}

func newFiles(t *testing.T) files {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	f := files{
		ca:         filepath.Join(dir, "ca.crt"),
		notPEM:     filepath.Join(dir, "not.pem"),
		kubeconfig: filepath.Join(dir, "kubeconfig"),
		missing:    filepath.Join(dir, "missing"),
		insecure:   filepath.Join(dir, "insecure-kubeconfig"),
	}
	require.NoError(t, os.WriteFile(f.ca, caPEM, 0o600))
	require.NoError(t, os.WriteFile(f.notPEM, []byte("hello"), 0o600))
	require.NoError(t, os.WriteFile(f.kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.96.0.1:443", certificate-authority: `+f.ca+`}
users:
- name: u
  user: {token: secret}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`), 0o600))
	require.NoError(t, os.WriteFile(f.insecure, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.96.0.1:443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`), 0o600))
	return f
}

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestValidation(t *testing.T) {
	f := newFiles(t)
	defer main.SetServiceAccount(f.missing, f.missing)()
	defer main.SetLookupHost(lookupLocalhost)()
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp"}
	tests := []struct {
		name string
		args []string
		env  []string
		// want lists what the message must name: flag or variable, value.
		want []string
	}{
		{"no endpoints", []string{"--probe=tcp"}, nil, []string{"--endpoints", `""`, "at least one"}},
		{"blank endpoints", []string{"--endpoints= , ", "--probe=tcp"}, nil, []string{"--endpoints", "at least one"}},
		{"endpoint without port", []string{"--endpoints=10.0.0.1", "--probe=tcp"}, nil, []string{"--endpoints", `"10.0.0.1"`, "missing port", "1-65535"}},
		{"endpoint port 0", []string{"--endpoints=10.0.0.1:0", "--probe=tcp"}, nil, []string{"--endpoints", `"10.0.0.1:0"`, "1-65535"}},
		{"endpoint port too big", []string{"--endpoints=10.0.0.1:65536", "--probe=tcp"}, nil, []string{"--endpoints", `"10.0.0.1:65536"`}},
		{"endpoint bad name", []string{"--endpoints=api_server:6443", "--probe=tcp"}, nil, []string{"--endpoints", `"api_server:6443"`, "DNS name"}},
		{"endpoint bad IPv6", []string{"--endpoints=[fe80::zz]:6443", "--probe=tcp"}, nil, []string{"--endpoints", `"[fe80::zz]:6443"`}},
		{"endpoint unspecified", []string{"--endpoints=0.0.0.0:6443", "--probe=tcp"}, nil, []string{"--endpoints", `"0.0.0.0:6443"`, "unspecified"}},
		{"one bad among good", []string{"--endpoints=10.0.0.1:6443,nope", "--probe=tcp"}, nil, []string{"--endpoints", `"nope"`}},
		{"endpoints from env", nil, []string{"LOCALPROXY_ENDPOINTS", "bad", "LOCALPROXY_PROBE", "tcp"}, []string{"LOCALPROXY_ENDPOINTS", `"bad"`}},
		// The pool keeps one entry per address: the second would be
		// merged into the first, and one of the zones lost.
		{"endpoint twice, once with a zone", []string{"--endpoints=10.0.0.1:6443@zone-a,10.0.0.1:6443", "--probe=tcp"}, nil, []string{
			`invalid --endpoints="10.0.0.1:6443": the same address, 10.0.0.1:6443, as "10.0.0.1:6443@zone-a" before it; want each API server once`}},
		{"endpoint twice in other spellings", []string{"--endpoints=[FD00::1]:6443,[fd00:0::1]:6443@zone-b", "--probe=tcp"}, nil, []string{
			`invalid --endpoints="[fd00:0::1]:6443@zone-b": the same address, [fd00::1]:6443, as "[FD00::1]:6443" before it`}},
		{"endpoint name twice from env", nil, []string{"LOCALPROXY_ENDPOINTS", "API.example.com.:443,10.0.0.1:6443, api.example.com:443", "LOCALPROXY_PROBE", "tcp"}, []string{
			`invalid LOCALPROXY_ENDPOINTS="api.example.com:443" (--endpoints): the same address, api.example.com:443, as "API.example.com.:443" before it`}},
		// An endpoint this proxy accepts on (e.g. from a kubeconfig that
		// 'localproxy kubeconfig' rewrote) sends every connection back
		// into the proxy.
		{"endpoint is the proxy", []string{"--endpoints=10.0.0.1:6443,127.0.0.1:7445", "--probe=tcp"}, nil, []string{
			`invalid --endpoints="127.0.0.1:7445": this proxy accepts clients on 127.0.0.1:7445 (--bind-address, --bind-port), so every connection to it would loop back into the proxy; want the API servers' own addresses`}},
		{"endpoint with a zone is the proxy, from env", nil, []string{"LOCALPROXY_ENDPOINTS", "[::1]:9000@zone-a", "LOCALPROXY_PROBE", "tcp", "LOCALPROXY_BIND_ADDRESS", "127.0.0.1,::1", "LOCALPROXY_BIND_PORT", "9000"}, []string{
			`invalid LOCALPROXY_ENDPOINTS="[::1]:9000@zone-a" (--endpoints): this proxy accepts clients on [::1]:9000 (LOCALPROXY_BIND_ADDRESS, LOCALPROXY_BIND_PORT)`}},
		{"loopback endpoint on an IPv4 wildcard listener", []string{"--endpoints=127.0.0.2:9000", "--probe=tcp", "--bind-address=0.0.0.0", "--bind-port=9000"}, nil, []string{
			`invalid --endpoints="127.0.0.2:9000": this proxy accepts clients on 0.0.0.0:9000 (--bind-address, --bind-port)`}},
		{"IPv4 loopback endpoint on an IPv6 wildcard listener, which takes IPv4 too", []string{"--endpoints=127.0.0.1:9000", "--probe=tcp", "--bind-address=::", "--bind-port=9000"}, nil, []string{
			`invalid --endpoints="127.0.0.1:9000": this proxy accepts clients on [::]:9000`}},
		{"wildcard bind address twice", []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-address=0.0.0.0,::"}, nil, []string{
			`invalid --bind-address="::": the same address, ::, as "0.0.0.0" before it`}},
		{"localhost endpoint on the proxy's port", []string{"--endpoints=LOCALHOST:7445", "--probe=tcp"}, nil, []string{
			`invalid --endpoints="LOCALHOST:7445": this proxy accepts clients on 127.0.0.1:7445`}},
		{"bind port too big", append(ok, "--bind-port=70000"), nil, []string{"--bind-port=70000", "1-65535"}},
		{"bind port from env", ok, []string{"LOCALPROXY_BIND_PORT", "70000"}, []string{"LOCALPROXY_BIND_PORT=70000", "1-65535"}},
		{"health port 0", append(ok, "--health-port=0"), nil, []string{"--health-port=0", "1-65535"}},
		{"same ports same address", append(ok, "--bind-port=8000", "--health-port=8000"), nil, []string{
			`invalid --health-port=8000: --bind-port=8000 is the same port, and the health address 127.0.0.1 (--health-bind-address unset: the first --bind-address) overlaps 127.0.0.1 in --bind-address; `,
			"want a port of its own, or a health address that overlaps no bind address (0.0.0.0 and :: overlap every address)"}},
		{"same ports, health on all addresses", append(ok, "--health-bind-address=0.0.0.0", "--health-port=7445"), nil, []string{
			`invalid --health-port=7445: --bind-port=7445 is the same port, and --health-bind-address="0.0.0.0" overlaps 127.0.0.1 in --bind-address;`}},
		{"same ports, bind on all addresses, from env", append(ok, "--bind-address=127.0.0.2,::"),
			[]string{"LOCALPROXY_HEALTH_PORT", "7445", "LOCALPROXY_HEALTH_BIND_ADDRESS", "::1"}, []string{
				`invalid LOCALPROXY_HEALTH_PORT=7445 (--health-port): --bind-port=7445 is the same port, and LOCALPROXY_HEALTH_BIND_ADDRESS="::1" (--health-bind-address) overlaps :: in --bind-address;`}},
		{"bind address neither IP nor host name", append(ok, "--bind-address=local_host"), nil, []string{"--bind-address", `"local_host"`, "IP address or a host name"}},
		{"bind address does not resolve", append(ok, "--bind-address=nowhere.invalid"), nil, []string{"--bind-address", `"nowhere.invalid"`, "does not resolve"}},
		{"bind address empty", append(ok, "--bind-address="), nil, []string{"--bind-address", "at least one"}},
		// Two listeners on one address (SO_REUSEPORT) split its clients,
		// and at shutdown each takes the other for its successor.
		{"bind address twice", append(ok, "--bind-address=127.0.0.1,::1,127.0.0.1"), nil, []string{
			`invalid --bind-address="127.0.0.1": the same address, 127.0.0.1, as "127.0.0.1" before it; want each address once`}},
		{"bind address and a host name of it", append(ok, "--bind-address=127.0.0.1,localhost"), nil, []string{
			`invalid --bind-address="localhost": the same address, 127.0.0.1, as "127.0.0.1" before it; want each address once`}},
		{"bind address and its IPv4-mapped form, from env", ok, []string{"LOCALPROXY_BIND_ADDRESS", "::ffff:127.0.0.1,127.0.0.1"}, []string{
			`invalid LOCALPROXY_BIND_ADDRESS="127.0.0.1" (--bind-address): the same address, 127.0.0.1, as "::ffff:127.0.0.1" before it`}},
		{"same ports, health on the IPv4-mapped bind address", append(ok, "--health-bind-address=::ffff:127.0.0.1", "--health-port=7445"), nil, []string{
			`invalid --health-port=7445: --bind-port=7445 is the same port, and --health-bind-address="::ffff:127.0.0.1" overlaps 127.0.0.1 in --bind-address;`}},
		{"health bind address neither IP nor host name", append(ok, "--health-bind-address=no_where"), nil, []string{"--health-bind-address", `"no_where"`}},
		{"liveness interval below 1s", append(ok, "--liveness-interval=500ms"), nil, []string{"--liveness-interval=500ms", "at least 1s"}},
		{"liveness threshold below 1s", append(ok, "--liveness-threshold=10ms"), nil, []string{"--liveness-threshold=10ms", "at least 1s"}},
		{"liveness threshold within a quiet round", []string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--liveness-threshold=3s"}, nil, []string{
			"invalid --liveness-threshold=3s: want more than 6s: the health-check loop starts a round every 5s ±10% while every API server is healthy, every 1s otherwise, and a probe may take 500ms"}},
		{"liveness threshold within a round", append(ok, "--health-interval=10s", "--health-timeout=2s"), []string{"LOCALPROXY_LIVENESS_THRESHOLD", "12s"}, []string{
			"invalid LOCALPROXY_LIVENESS_THRESHOLD=12s (--liveness-threshold): want more than 13s: the health-check loop starts a round every 10s ±10%, and a probe may take 2s"}},
		{"liveness threshold not above interval", append(ok, "--liveness-interval=5s", "--liveness-threshold=5s"), nil, []string{"--liveness-threshold=5s", "more than --liveness-interval=5s"}},
		{"probe mode", []string{"--endpoints=10.0.0.1:6443", "--probe=http"}, nil, []string{"--probe", `"http"`, "readyz, held, tls or tcp"}},
		{"probe mode from env", []string{"--endpoints=10.0.0.1:6443"}, []string{"LOCALPROXY_PROBE", "ping"}, []string{"LOCALPROXY_PROBE", `"ping"`}},
		{"interval below 1s", append(ok, "--health-interval=500ms", "--health-timeout=100ms"), nil, []string{"--health-interval=500ms", "at least 1s"}},
		{"timeout not below interval", append(ok, "--health-interval=2s", "--health-timeout=2s"), nil, []string{"--health-timeout=2s", "less than --health-interval"}},
		{"timeout zero", append(ok, "--health-timeout=0s"), nil, []string{"--health-timeout=0s"}},
		{"rise 0", append(ok, "--rise=0"), nil, []string{"--rise=0", "at least 1"}},
		{"fall 0", append(ok, "--fall=0"), nil, []string{"--fall=0", "at least 1"}},
		{"fall from env", ok, []string{"LOCALPROXY_FALL", "-1"}, []string{"invalid LOCALPROXY_FALL=-1 (--fall): want a whole number, at least 1"}},
		{"held without CA", []string{"--endpoints=10.0.0.1:6443"}, nil, []string{"--ca-file", "--probe=held", "--probe=tcp"}},
		{"tls without CA", []string{"--endpoints=10.0.0.1:6443", "--probe=tls"}, nil, []string{"--ca-file", "--probe=tls"}},
		{"CA file missing", []string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.missing}, nil, []string{"--ca-file", f.missing, "readable"}},
		{"CA file not PEM", []string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.notPEM}, nil, []string{"--ca-file", f.notPEM, "PEM"}},
		// --probe=tcp verifies no certificate, but the state file is
		// bound to the cluster by --ca-file, and a given value is checked
		// whatever the mode.
		{"CA file not PEM, tcp probe, state file", append(ok, "--ca-file="+f.notPEM, "--state-file="+filepath.Join(filepath.Dir(f.ca), "state.json")), nil, []string{
			`invalid --ca-file="` + f.notPEM + `": want a PEM file with at least one CA certificate`}},
		{"CA file not PEM, tcp probe", append(ok, "--ca-file="+f.notPEM), nil, []string{
			`invalid --ca-file="` + f.notPEM + `": want a PEM file with at least one CA certificate`}},
		{"CA file missing, tcp probe, from env", ok, []string{"LOCALPROXY_CA_FILE", f.missing}, []string{
			`invalid LOCALPROXY_CA_FILE="` + f.missing + `" (--ca-file): want a readable PEM file`}},
		{"negative ping interval, tcp probe", append(ok, "--probe-ping-interval=-1s"), nil, []string{"invalid --probe-ping-interval=-1s: want a positive duration"}},
		{"negative readyz interval, tcp probe", append(ok, "--probe-readyz-interval=-1s"), nil, []string{"invalid --probe-readyz-interval=-1s: want a positive duration"}},
		{"negative idle readyz interval, tcp probe, from env", ok, []string{"LOCALPROXY_PROBE_IDLE_READYZ_INTERVAL", "-1m"}, []string{
			"invalid LOCALPROXY_PROBE_IDLE_READYZ_INTERVAL=-1m0s (--probe-idle-readyz-interval): want a positive duration"}},
		{"negative ping interval, bad probe mode", []string{"--endpoints=10.0.0.1:6443", "--probe=http", "--probe-ping-interval=-1s"}, nil, []string{"invalid --probe-ping-interval=-1s"}},
		{"server name", append(ok, "--tls-server-name=bad_name"), nil, []string{"--tls-server-name", `"bad_name"`}},
		{"kubeconfig missing", append(ok, "--enable-discovery", "--kubeconfig="+f.missing), nil, []string{"--kubeconfig", f.missing, "existing"}},
		{"state file without a CA", append(ok, "--state-file=/var/lib/x/state.json"), nil, []string{`invalid --state-file="/var/lib/x/state.json"`, "bound to the cluster by its CA", "--ca-file"}},
		// Checked at start: every save would fail otherwise, logged only.
		{"state file is a directory", append(ok, "--ca-file="+f.ca, "--state-file="+filepath.Dir(f.ca)), nil, []string{
			`invalid --state-file="` + filepath.Dir(f.ca) + `": it is a directory; want the path of a regular file (created if missing) in an existing directory, e.g. /var/lib/localproxy/state.json`}},
		{"state file with a trailing slash", append(ok, "--ca-file="+f.ca, "--state-file="+filepath.Dir(f.ca)+"/new/"), nil, []string{
			`invalid --state-file="` + filepath.Dir(f.ca) + `/new/": it ends in a slash; want the path of a regular file`}},
		{"state file in a missing directory", append(ok, "--ca-file="+f.ca, "--state-file="+filepath.Join(f.missing, "state.json")), nil, []string{
			`invalid --state-file="` + filepath.Join(f.missing, "state.json") + `": its directory ` + f.missing + ` does not exist; want the path of a regular file (created if missing) in an existing directory`}},
		{"state file in a file", append(ok, "--ca-file="+f.ca, "--state-file="+filepath.Join(f.ca, "state.json")), nil, []string{
			`invalid --state-file="` + filepath.Join(f.ca, "state.json") + `": ` + f.ca + ` is not a directory; want the path of a regular file (created if missing) in an existing directory`}},
		{"state file relative", append(ok, "--ca-file="+f.ca, "--state-file=state.json"), nil, []string{
			`invalid --state-file="state.json": want an absolute path, e.g. /var/lib/localproxy/state.json`}},
		{"state file blank, from env", append(ok, "--ca-file="+f.ca), []string{"LOCALPROXY_STATE_FILE", " "}, []string{
			`invalid LOCALPROXY_STATE_FILE=" " (--state-file): want an absolute path, e.g. /var/lib/localproxy/state.json`}},
		{"state file with a leading space", append(ok, "--ca-file="+f.ca, "--state-file= "+f.ca+".state"), nil, []string{
			`invalid --state-file=" ` + f.ca + `.state": want an absolute path`}},
		{"kubeconfig invalid", append(ok, "--enable-discovery", "--kubeconfig="+f.notPEM), nil, []string{"--kubeconfig", f.notPEM, "valid kubeconfig"}},
		{"kubeconfig missing without discovery", append(ok, "--kubeconfig="+f.missing), nil, []string{"--kubeconfig", f.missing, "existing"}},
		{"negative drain", append(ok, "--drain-timeout=-1s"), nil, []string{"--drain-timeout=-1s"}},
		{"negative shutdown timeout", append(ok, "--shutdown-timeout=-5s"), nil, []string{"--shutdown-timeout=-5s"}},
		{"negative handover timeout", ok, []string{"LOCALPROXY_HANDOVER_TIMEOUT", "-1s"}, []string{"LOCALPROXY_HANDOVER_TIMEOUT=-1s", "0 (no hand-over) or a positive duration"}},
		{"negative first-byte timeout", append(ok, "--first-byte-timeout=-1ms"), nil, []string{"--first-byte-timeout=-1ms", "0 (off) or a positive duration"}},
		{"max connections 0", append(ok, "--max-connections=0"), nil, []string{"--max-connections=0", "at least 1"}},
		{"gomaxprocs negative", append(ok, "--gomaxprocs=-1"), nil, []string{"invalid --gomaxprocs=-1: want a whole number 0-1024"}},
		// The runtime aborts on more than an int32 of Ps ("procresize:
		// invalid arg"), and allocates per P long before that.
		{"gomaxprocs beyond int32", append(ok, "--gomaxprocs=2147483648"), nil, []string{"invalid --gomaxprocs=2147483648: want a whole number 0-1024"}},
		{"gomaxprocs too high from env", ok, []string{"LOCALPROXY_GOMAXPROCS", "1025"}, []string{"invalid LOCALPROXY_GOMAXPROCS=1025 (--gomaxprocs): want a whole number 0-1024"}},
		{"proxy protocol", append(ok, "--proxy-protocol=v3"), nil, []string{"--proxy-protocol", `"v3"`, "none, v1 or v2"}},
		{"loopback congestion control", append(ok, "--loopback-congestion-control=nosuchcc"), nil, []string{`invalid --loopback-congestion-control="nosuchcc"`, "not in this kernel", "tcp_available_congestion_control", `or "system"`}},
		{"loopback congestion control name", ok, []string{"LOCALPROXY_LOOPBACK_CONGESTION_CONTROL", "BBR"}, []string{`LOCALPROXY_LOOPBACK_CONGESTION_CONTROL="BBR"`, "lowercase letters"}},
		{"log level", append(ok, "--log-level=loud"), nil, []string{"--log-level", `"loud"`, "0-10"}},
		{"log level too high", append(ok, "--log-level=11"), nil, []string{"--log-level", `"11"`}},
		{"log format", append(ok, "--log-format=xml"), nil, []string{"--log-format", `"xml"`, "text or json"}},
		{"log format from env", ok, []string{"LOCALPROXY_LOG_FORMAT", "yaml"}, []string{"LOCALPROXY_LOG_FORMAT", `"yaml"`}},
		{"positional argument", append(ok, "extra"), nil, []string{`"extra"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireRefused(t, tc.args, tc.env)
			var stdout, stderr bytes.Buffer
			code := main.Run(t.Context(), tc.args, env(tc.env...), &stdout, &stderr)
			assert.Equal(t, main.ExitUsage, code, "stderr: %s", stderr.String())
			for _, w := range tc.want {
				assert.Contains(t, stderr.String(), w)
			}
			if stderr.Len() == 0 {
				t.Error("no message")
			}
		})
	}
}

// TestSelfEndpointOnAHostAddress: under a wildcard bind address, an
// endpoint at one of this host's own addresses (not loopback) on the bind
// port is the proxy itself, as a kubeconfig naming the node's IP would
// make it; a listener on loopback alone does not take it.
func TestSelfEndpointOnAHostAddress(t *testing.T) {
	var ip netip.Addr
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			ip = p.Addr()
			break
		}
	}
	if !ip.IsValid() {
		t.Skip("this host has no IPv4 address but loopback")
	}
	ep := net.JoinHostPort(ip.String(), "9000")
	for _, bind := range []string{"0.0.0.0", "::"} {
		args := []string{"--endpoints=10.0.0.1:6443," + ep, "--probe=tcp", "--bind-address=" + bind, "--bind-port=9000"}
		_, err = main.ParseConfig(args, env())
		require.Error(t, err, "bind address %s", bind)
		assert.Contains(t, err.Error(), `invalid --endpoints="`+ep+`": this proxy accepts clients on `+net.JoinHostPort(bind, "9000"))
	}
	_, err = main.ParseConfig([]string{"--endpoints=" + ep, "--probe=tcp", "--bind-address=127.0.0.1", "--bind-port=9000"}, env())
	require.NoError(t, err)
	_, err = main.ParseConfig([]string{"--endpoints=" + net.JoinHostPort(ip.String(), "6443"), "--probe=tcp", "--bind-address=0.0.0.0", "--bind-port=9000"}, env())
	require.NoError(t, err, "another port")
}

// requireRefused stops the test at once if args and the environment kv
// make a valid configuration, which run would serve until the test times
// out.
func requireRefused(t *testing.T, args, kv []string) {
	t.Helper()
	if _, err := main.ParseConfig(args, env(kv...)); err == nil {
		t.Fatalf("accepted: %q with environment %q", args, kv)
	}
}

// lookupLocalhost resolves bind address host names for the tests:
// localhost is ::1 and 127.0.0.1, no other name resolves.
func lookupLocalhost(host string) ([]netip.Addr, error) {
	if host == "localhost" {
		return []netip.Addr{netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, fmt.Errorf("lookup %s: no such host", host)
}

// Discovery with a kubeconfig that skips certificate verification would
// send its credentials to whoever answers on a discovered address.
func TestInsecureKubeconfig(t *testing.T) {
	f := newFiles(t)
	_, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--enable-discovery", "--kubeconfig=" + f.insecure}, env())
	require.Error(t, err)
	for _, w := range []string{"--kubeconfig", f.insecure, "insecure-skip-tls-verify", "certificate-authority", "--enable-discovery"} {
		assert.ErrorContains(t, err, w)
	}
	// Without discovery the kubeconfig only gives the probes credentials,
	// and probes verify certificates with --ca-file.
	cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--kubeconfig=" + f.insecure, "--enable-discovery=false"}, env())
	require.NoError(t, err)
	assert.Nil(t, cfg.Discovery)
	// Discovery by default, not asked for: off, with a warning.
	cfg, warnings, err := main.ParseConfigWarnings([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--kubeconfig=" + f.insecure}, env())
	require.NoError(t, err)
	assert.Nil(t, cfg.Discovery)
	require.Len(t, warnings, 1)
	assert.Contains(t, warnings[0], "discovery is off")
	assert.Contains(t, warnings[0], "insecure-skip-tls-verify")
}

func TestValidationReportsEveryProblem(t *testing.T) {
	var stderr bytes.Buffer
	code := main.Run(t.Context(), []string{"--endpoints=x", "--rise=0", "--fall=0", "--probe=tcp"}, env(), io.Discard, &stderr)
	assert.Equal(t, main.ExitUsage, code)
	assert.Equal(t, 3, strings.Count(stderr.String(), "localproxy: invalid"), stderr.String())
}

// TestBadValues covers values that do not parse as their flag's kind,
// unknown flags and missing values, from flags and from the environment.
func TestBadValues(t *testing.T) {
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp"}
	const (
		duration = "not a duration; want a Go duration with a unit, such as 1s, 500ms or 2m"
		port     = "; want a port number 1-65535"
		atLeast1 = "; want a whole number, at least 1"
		boolean  = "not a boolean; want true or false"
		rule     = "want " + localproxy.ZoneRule
	)
	tests := []struct {
		name string
		args []string
		env  []string
		// want are the lines expected, without the "localproxy: " prefix.
		want []string
	}{
		{"duration", append(ok, "--health-interval=abc"), nil, []string{`invalid --health-interval="abc": ` + duration}},
		{"duration without unit", append(ok, "--health-timeout=1"), nil, []string{`invalid --health-timeout="1": ` + duration}},
		{"duration from env", ok, []string{"LOCALPROXY_HEALTH_TIMEOUT", "1"}, []string{`invalid LOCALPROXY_HEALTH_TIMEOUT="1" (--health-timeout): ` + duration}},
		{"drain timeout from env", ok, []string{"LOCALPROXY_DRAIN_TIMEOUT", "forever"}, []string{`invalid LOCALPROXY_DRAIN_TIMEOUT="forever" (--drain-timeout): ` + duration}},
		{"int", append(ok, "--rise=x"), nil, []string{`invalid --rise="x": not a whole number` + atLeast1}},
		{"int with a fraction", append(ok, "--max-connections=1.5"), nil, []string{`invalid --max-connections="1.5": not a whole number` + atLeast1}},
		{"port", append(ok, "--bind-port=http"), nil, []string{`invalid --bind-port="http": not a whole number` + port}},
		{"port beyond int", append(ok, "--health-port=99999999999999999999"), nil, []string{`invalid --health-port="99999999999999999999": out of range` + port}},
		{"port from env", ok, []string{"LOCALPROXY_BIND_PORT", "http"}, []string{`invalid LOCALPROXY_BIND_PORT="http" (--bind-port): not a whole number` + port}},
		{"int from env", ok, []string{"LOCALPROXY_FALL", "two"}, []string{`invalid LOCALPROXY_FALL="two" (--fall): not a whole number` + atLeast1}},
		{"bool", append(ok, "--enable-discovery=maybe"), nil, []string{`invalid --enable-discovery="maybe": ` + boolean}},
		{"bool from env", ok, []string{"LOCALPROXY_ENABLE_DISCOVERY", "sure"}, []string{`invalid LOCALPROXY_ENABLE_DISCOVERY="sure" (--enable-discovery): ` + boolean}},
		{"every bad variable", ok, []string{"LOCALPROXY_RISE", "x", "LOCALPROXY_HEALTH_INTERVAL", "soon"}, []string{
			`invalid LOCALPROXY_HEALTH_INTERVAL="soon" (--health-interval): ` + duration,
			`invalid LOCALPROXY_RISE="x" (--rise): not a whole number` + atLeast1}},
		{"unknown flag", append(ok, "--frobnicate"), nil, []string{"unknown flag --frobnicate; want one of the flags 'localproxy --help' lists"}},
		{"missing value", append(ok, "--rise"), nil, []string{"invalid --rise: missing value" + atLeast1}},
		// Flags are parsed as Kubernetes components parse them (pflag):
		// a long flag takes two dashes.
		{"long flag with one dash", append(ok, "-rise=3"), nil, []string{"unknown flag -rise=3; long flags take two dashes: --rise=3"}},
		{"unknown one-letter flag", append(ok, "-x"), nil, []string{"unknown flag -x; localproxy has no one-letter flags but -h; want one of the flags 'localproxy --help' lists"}},
		{"missing duration", append(ok, "--health-interval"), nil, []string{"invalid --health-interval: missing value; want a Go duration with a unit, such as 1s, 500ms or 2m"}},
		{"bad bool", append(ok, "--enable-discovery=maybe"), nil, []string{`invalid --enable-discovery="maybe": not a boolean; want true or false`}},
		// Values that parse but are out of range read the same way.
		{"out of range", append(ok, "--rise=0"), nil, []string{"invalid --rise=0: want a whole number, at least 1"}},
		{"out of range from env", ok, []string{"LOCALPROXY_BIND_PORT", "0"}, []string{"invalid LOCALPROXY_BIND_PORT=0 (--bind-port): want a port number 1-65535"}},
		// A variable a flag overrides is still checked: it would take
		// effect once the flag is dropped from the unit or manifest.
		{"out of range from an overridden env", append(ok, "--rise=3"), []string{"LOCALPROXY_RISE", "0"}, []string{"invalid LOCALPROXY_RISE=0 (--rise): want a whole number, at least 1"}},
		{"port out of range beside its flag", append(ok, "--bind-port=7445"), []string{"LOCALPROXY_BIND_PORT", "70000"}, []string{"invalid LOCALPROXY_BIND_PORT=70000 (--bind-port): want a port number 1-65535"}},
		{"enum", append(ok, "--log-format=xml"), nil, []string{`invalid --log-format="xml": want text or json`}},
		{"enum from env", []string{"--endpoints=10.0.0.1:6443"}, []string{"LOCALPROXY_PROBE", "ping"}, []string{`invalid LOCALPROXY_PROBE="ping" (--probe): want readyz, held, tls or tcp`}},
		// Zones: --zone, zones in --endpoints, --node-name.
		{"zone", append(ok, "--zone=-a"), nil, []string{`invalid --zone="-a": the zone "-a" is not a label value; ` + rule}},
		{"zone too long", append(ok, "--zone="+strings.Repeat("z", 64)), nil, []string{`invalid --zone="` + strings.Repeat("z", 64) + `": the zone "` + strings.Repeat("z", 64) + `" has 64 characters; ` + rule}},
		{"zone from env", ok, []string{"LOCALPROXY_ZONE", "eu west"}, []string{`invalid LOCALPROXY_ZONE="eu west" (--zone): the zone "eu west" is not a label value; ` + rule}},
		{"endpoint zone empty", []string{"--endpoints=10.0.0.1:6443@", "--probe=tcp"}, nil, []string{`invalid --endpoints="10.0.0.1:6443@": zone is empty; ` + rule + ` (host:port@zone)`}},
		{"endpoint zone bad", []string{"--endpoints=10.0.0.1:6443@a,[::1]:6443@a/b", "--probe=tcp"}, nil, []string{`invalid --endpoints="[::1]:6443@a/b": zone "a/b" is not a label value; ` + rule + ` (host:port@zone)`}},
		{"endpoint zone from env", []string{"--probe=tcp"}, []string{"LOCALPROXY_ENDPOINTS", "10.0.0.1:6443@-"}, []string{`invalid LOCALPROXY_ENDPOINTS="10.0.0.1:6443@-" (--endpoints): zone "-" is not a label value; ` + rule + ` (host:port@zone)`}},
		{"endpoint address before a zone", []string{"--endpoints=10.0.0.1@zone-a", "--probe=tcp"}, nil, []string{`invalid --endpoints="10.0.0.1@zone-a": missing port in address; want host:port with an IPv4 address, a bracketed IPv6 address or an RFC 1123 DNS name, and a port 1-65535, optionally followed by @zone`}},
		{"node name", append(ok, "--node-name=Node_1"), nil, []string{`invalid --node-name="Node_1": want a Node name: an RFC 1123 subdomain of at most 253 lowercase letters, digits, '-' and '.'`}},
		{"node name from NODE_NAME", ok, []string{"NODE_NAME", "-n1"}, []string{`invalid NODE_NAME="-n1" (--node-name): want a Node name: an RFC 1123 subdomain of at most 253 lowercase letters, digits, '-' and '.'`}},
		// The flag wins over its variable, but a variable that does not
		// parse is a mistake all the same.
		{"bad variable beside its flag", append(ok, "--rise=3"), []string{"LOCALPROXY_RISE", "x"}, []string{`invalid LOCALPROXY_RISE="x" (--rise): not a whole number` + atLeast1}},
		{"bad duration variable beside its flag", append(ok, "--health-interval=2s"), []string{"LOCALPROXY_HEALTH_INTERVAL", "soon"}, []string{`invalid LOCALPROXY_HEALTH_INTERVAL="soon" (--health-interval): ` + duration}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireRefused(t, tc.args, tc.env)
			var stderr bytes.Buffer
			code := main.Run(t.Context(), tc.args, env(tc.env...), io.Discard, &stderr)
			assert.Equal(t, main.ExitUsage, code, "stderr: %s", stderr.String())
			var want []string
			for _, w := range tc.want {
				want = append(want, "localproxy: "+w)
			}
			want = append(want, "Run 'localproxy --help' for the flags.")
			assert.Equal(t, want, strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n"), "only these lines, no usage dump")
		})
	}
}

func TestStatusBadValues(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"duration", []string{"status", "--timeout=5"}, nil, `localproxy status: invalid --timeout="5": not a duration; want a Go duration with a unit, such as 1s, 500ms or 2m`},
		{"port from env", []string{"status"}, []string{"LOCALPROXY_HEALTH_PORT", "http"}, `localproxy status: invalid LOCALPROXY_HEALTH_PORT="http" (--health-port): not a whole number; want a port number 1-65535`},
		{"unknown flag", []string{"status", "--bind-port=1"}, nil, "localproxy status: unknown flag --bind-port; want one of the flags 'localproxy status --help' lists"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			assert.Equal(t, main.ExitUsage, main.Run(t.Context(), tc.args, env(tc.env...), io.Discard, &stderr))
			assert.Equal(t, tc.want+"\n", stderr.String())
		})
	}
}

func TestValidConfigs(t *testing.T) {
	f := newFiles(t)
	defer main.SetServiceAccount(f.missing, f.missing)()

	t.Run("defaults", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443, [fd00::1]:6443,API.example.com.:443", "--ca-file=" + f.ca}, env())
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.1:6443", "[fd00::1]:6443", "api.example.com:443"}, cfg.Endpoints)
		assert.Equal(t, []string{"127.0.0.1:7445"}, cfg.ListenAddresses)
		assert.Equal(t, "127.0.0.1:7446", cfg.HealthAddress)
		assert.Equal(t, "kubernetes.default.svc", cfg.Origin)
		assert.Equal(t, time.Second, cfg.Pool.Interval)
		assert.Equal(t, 2, cfg.Pool.Rise)
		assert.Equal(t, 2, cfg.Pool.Fall)
		assert.NotNil(t, cfg.Probe)
		assert.Nil(t, cfg.Discovery)
		assert.Equal(t, localproxy.DefaultMaxConnections, cfg.MaxConnections)
		assert.Equal(t, localproxy.DefaultFirstByteTimeout, cfg.FirstByteTimeout)
		assert.Equal(t, localproxy.DefaultHandoverTimeout, cfg.HandoverTimeout)
		assert.False(t, cfg.Profiling, "profiles are served only when asked")
	})
	t.Run("profiling", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--profiling"}, env())
		require.NoError(t, err)
		assert.True(t, cfg.Profiling)
		cfg, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env("LOCALPROXY_PROFILING", "true"))
		require.NoError(t, err)
		assert.True(t, cfg.Profiling)
		_, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env("LOCALPROXY_PROFILING", "sometimes"))
		require.ErrorContains(t, err, "sometimes")
	})
	t.Run("handover timeout", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env("LOCALPROXY_HANDOVER_TIMEOUT", "5s"))
		require.NoError(t, err)
		assert.Equal(t, 5*time.Second, cfg.HandoverTimeout)
		cfg, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--handover-timeout=0"}, env())
		require.NoError(t, err)
		assert.Negative(t, cfg.HandoverTimeout, "0: no hand-over")
	})
	t.Run("held probes", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--probe=held", "--probe-ping-interval=1s"}, env())
		require.NoError(t, err)
		require.NotNil(t, cfg.Probe)
		assert.Equal(t, endpoint.ProbeHeld, cfg.Probe.Mode)
		assert.Equal(t, time.Second, cfg.Probe.PingInterval)
		_, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--probe=held", "--probe-ping-interval=-1s"}, env())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--probe-ping-interval=-1s")

		cfg, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env("LOCALPROXY_PROBE_READYZ_INTERVAL", "15s"))
		require.NoError(t, err)
		assert.Equal(t, endpoint.ProbeHeld, cfg.Probe.Mode, "held is the default")
		assert.Equal(t, 15*time.Second, cfg.Probe.ReadyzInterval)
		_, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--probe-readyz-interval=-2s"}, env())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--probe-readyz-interval=-2s")

		cfg, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--probe-idle-readyz-interval=1m"}, env())
		require.NoError(t, err)
		assert.Equal(t, time.Minute, cfg.Probe.IdleReadyzInterval)
		_, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env("LOCALPROXY_PROBE_IDLE_READYZ_INTERVAL", "-1s"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "probe-idle-readyz-interval")
	})
	t.Run("first-byte watch off", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp"}, env("LOCALPROXY_FIRST_BYTE_TIMEOUT", "0"))
		require.NoError(t, err)
		assert.Negative(t, cfg.FirstByteTimeout)
	})
	t.Run("flag wins over env", func(t *testing.T) {
		// A variable that does not parse is refused even so
		// (TestBadValues); one that parses is ignored with a warning.
		cfg, warnings, err := main.ParseConfigWarnings([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--bind-port=9000", "--enable-discovery=false"},
			env("LOCALPROXY_BIND_PORT", "8000", "LOCALPROXY_ENDPOINTS", "nope", "LOCALPROXY_DRAIN_TIMEOUT", "3s", "LOCALPROXY_BIND_ADDRESS", "127.0.0.1,::1"))
		require.NoError(t, err)
		assert.Equal(t, []string{"127.0.0.1:9000", "[::1]:9000"}, cfg.ListenAddresses)
		assert.Equal(t, []string{"10.0.0.1:6443"}, cfg.Endpoints)
		assert.Equal(t, 3*time.Second, cfg.DrainTimeout)
		assert.ElementsMatch(t, []string{
			`LOCALPROXY_ENDPOINTS="nope" (--endpoints) is ignored: --endpoints="10.0.0.1:6443" is given on the command line, and the flag wins`,
			"LOCALPROXY_BIND_PORT=8000 (--bind-port) is ignored: --bind-port=9000 is given on the command line, and the flag wins",
		}, warnings)
	})
	t.Run("API servers on this host, beside the proxy", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=127.0.0.1:6443,127.0.0.2:7445,[::1]:7445,localhost:6443", "--probe=tcp"}, env())
		require.NoError(t, err, "another port, or another loopback address than the proxy's")
		assert.Equal(t, []string{"127.0.0.1:6443", "127.0.0.2:7445", "[::1]:7445", "localhost:6443"}, cfg.Endpoints)
		_, err = main.ParseConfig([]string{"--endpoints=[::1]:7445", "--probe=tcp", "--bind-address=0.0.0.0"}, env())
		require.Error(t, err, "Go listens on 0.0.0.0 as on ::, dual-stack: [::1]:7445 is the proxy")
		assert.Contains(t, err.Error(), `invalid --endpoints="[::1]:7445": this proxy accepts clients on 0.0.0.0:7445`)
	})
	t.Run("same port on different addresses", func(t *testing.T) {
		_, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--health-bind-address=127.0.0.2", "--health-port=7445"}, env())
		require.NoError(t, err)
	})
	t.Run("discovery goes through the proxy", func(t *testing.T) {
		stateFile := filepath.Join(t.TempDir(), "state.json")
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--enable-discovery",
			"--kubeconfig=" + f.kubeconfig, "--tls-server-name=api.example.com", "--bind-port=7500", "--state-file=" + stateFile, "--proxy-protocol=v2"}, env())
		require.NoError(t, err)
		require.NotNil(t, cfg.Discovery)
		assert.Equal(t, "https://127.0.0.1:7500", cfg.Discovery.Host)
		assert.Equal(t, "api.example.com", cfg.Discovery.TLSClientConfig.ServerName)
		assert.Equal(t, "secret", cfg.Discovery.BearerToken)
		assert.Equal(t, "api.example.com", cfg.Origin)
		assert.Equal(t, stateFile, cfg.StateFile)
		assert.Equal(t, localproxy.ProxyProtocolV2, cfg.ProxyProtocol)
		assert.Empty(t, cfg.LoopbackCongestionControl, "the library's default, which gives way to the system's where not allowed")
	})
	t.Run("loopback congestion control", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--loopback-congestion-control=system"}, env())
		require.NoError(t, err)
		assert.Equal(t, localproxy.SystemCongestionControl, cfg.LoopbackCongestionControl)
	})
	t.Run("probes use the kubeconfig's credentials", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--kubeconfig=" + f.kubeconfig}, env())
		require.NoError(t, err)
		assert.NotNil(t, cfg.Discovery, "discovery is on by default where there are credentials")
		pr := newProber(t, cfg)
		require.NotNil(t, pr.Authorization)
		assert.Equal(t, "Bearer secret", pr.Authorization())
	})
	t.Run("probes are anonymous without credentials", func(t *testing.T) {
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca}, env())
		require.NoError(t, err)
		assert.Nil(t, newProber(t, cfg).Authorization)
	})
	t.Run("in-cluster service account", func(t *testing.T) {
		defer main.SetServiceAccount(f.kubeconfig, f.ca)() // any existing file will do as a token
		cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--enable-discovery"}, env())
		require.NoError(t, err)
		assert.Equal(t, "https://127.0.0.1:7445", cfg.Discovery.Host)
		assert.Equal(t, f.ca, cfg.Discovery.TLSClientConfig.CAFile)
		assert.Equal(t, "kubernetes.default.svc", cfg.Discovery.TLSClientConfig.ServerName)
		assert.NotNil(t, newProber(t, cfg).Authorization, "probes use the service account token")
	})
}

// newProber builds the Prober of cfg's probe configuration, as
// localproxy.New does.
func newProber(t *testing.T, cfg localproxy.Config) *endpoint.Prober {
	t.Helper()
	require.NotNil(t, cfg.Probe)
	pr, err := endpoint.NewProber(*cfg.Probe)
	require.NoError(t, err)
	return pr
}

func TestVersionAndHelp(t *testing.T) {
	var stdout bytes.Buffer
	assert.Equal(t, main.ExitOK, main.Run(t.Context(), []string{"--version"}, env(), &stdout, io.Discard))
	assert.Contains(t, stdout.String(), "localproxy ")
	var stderr bytes.Buffer
	assert.Equal(t, main.ExitOK, main.Run(t.Context(), []string{"--help"}, env(), io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "LOCALPROXY_BIND_PORT")
	// The flags' own types and defaults, not those of the values wrapped
	// while parsing.
	assert.Contains(t, stderr.String(), "  --health-interval duration ")
	assert.Contains(t, stderr.String(), "  --bind-port int ")
	assert.Contains(t, stderr.String(), "  --enable-discovery ")
	assert.NotContains(t, stderr.String(), "panic:")
	stderr.Reset()
	assert.Equal(t, main.ExitOK, main.Run(t.Context(), []string{"status", "-h"}, env(), io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "  --timeout duration ")
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunForwardsAndStatus(t *testing.T) {
	defer main.SetGOMAXPROCS(main.SetGOMAXPROCS(7))
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	port, hport := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(t.Context())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- main.Run(ctx, []string{"--endpoints=" + echo.Addr().String(), "--probe=tcp", "--rise=1",
			"--bind-port=" + strconv.Itoa(port), "--health-port=" + strconv.Itoa(hport), "--log-format=json", "--gomaxprocs=3"}, env(), io.Discard, &logs)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var c net.Conn
	require.Eventually(t, func() bool {
		c, err = net.Dial("tcp", addr)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	defer c.Close()
	_, err = io.WriteString(c, "ping")
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))

	var out bytes.Buffer
	require.Eventually(t, func() bool {
		out.Reset()
		code := main.Run(t.Context(), []string{"status"}, env("LOCALPROXY_HEALTH_PORT", strconv.Itoa(hport)), &out, io.Discard)
		return code == main.ExitOK && strings.Contains(out.String(), "healthy")
	}, 10*time.Second, 20*time.Millisecond, "status output: %s", out.String())
	assert.Contains(t, out.String(), echo.Addr().String())
	assert.Contains(t, out.String(), "ENDPOINT")
	assert.Contains(t, out.String(), "ready: yes")

	c.Close() // else shutdown waits for it
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, main.ExitOK, code)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return")
	}
	assert.Contains(t, logs.String(), `"msg":"proxy listening"`)
	assert.Contains(t, logs.String(), `"gomaxprocs":3`, "run did not apply --gomaxprocs")
}

func TestStatusErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int
		want string
	}{
		{"output", []string{"--output=yaml"}, nil, main.ExitUsage, `localproxy status: invalid --output="yaml": want table or json`},
		{"no proxy", []string{"--health-port=" + strconv.Itoa(freePort(t))}, nil, main.ExitError, "connect"},
		// A timeout that has passed before the request fails it with
		// "context deadline exceeded", naming no flag.
		{"timeout 0", []string{"--timeout=0"}, nil, main.ExitUsage, "localproxy status: invalid --timeout=0s: want a positive duration, e.g. 5s"},
		{"negative timeout from env", nil, []string{"LOCALPROXY_TIMEOUT", "-1s"}, main.ExitUsage, "localproxy status: invalid LOCALPROXY_TIMEOUT=-1s (--timeout): want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			assert.Equal(t, tc.code, main.Run(t.Context(), append([]string{"status"}, tc.args...), env(tc.env...), io.Discard, &stderr))
			assert.Contains(t, stderr.String(), tc.want)
		})
	}
}

// What extractedprism's users have in their manifests starts localproxy
// with the same meaning, or with a warning where localproxy has no such
// setting, never with exit 2.
func TestExtractedprismFlags(t *testing.T) {
	f := newFiles(t)
	defer main.SetServiceAccount(f.missing, f.missing)()
	defer main.SetLookupHost(lookupLocalhost)()
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp"}

	t.Run("host name bind address, health server beside it", func(t *testing.T) {
		cfg, warnings, err := main.ParseConfigWarnings(append(ok, "--bind-address=localhost", "--enable-discovery=false"), env())
		require.NoError(t, err)
		assert.Equal(t, []string{"127.0.0.1:7445"}, cfg.ListenAddresses, "the address net.Listen would take: IPv4 first")
		assert.Equal(t, "127.0.0.1:7446", cfg.HealthAddress)
		assert.Empty(t, warnings)
	})
	t.Run("health bind address defaults to the bind address", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(ok, "--bind-address=127.0.0.2,127.0.0.3"), env())
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.2:7446", cfg.HealthAddress)
	})
	t.Run("IPv4-mapped bind addresses", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(ok, "--bind-address=::ffff:127.0.0.1,::FFFF:0.0.0.0", "--bind-port=9000", "--health-bind-address=::ffff:127.0.0.2"), env())
		require.NoError(t, err)
		assert.Equal(t, []string{"127.0.0.1:9000", "0.0.0.0:9000"}, cfg.ListenAddresses, "the IPv4 addresses net.Listen takes them for")
		assert.Equal(t, "127.0.0.2:7446", cfg.HealthAddress)
	})
	t.Run("host name health bind address", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(ok, "--health-bind-address=localhost"), env())
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1:7446", cfg.HealthAddress)
	})
	t.Run("unresolvable host name", func(t *testing.T) {
		_, err := main.ParseConfig(append(ok, "--bind-address=api.example"), env())
		require.Error(t, err)
		assert.Contains(t, err.Error(), `invalid --bind-address="api.example": the host name does not resolve`)
	})
	for _, level := range []string{"debug", "info", "warn", "error", "dpanic", "panic", "fatal"} {
		t.Run("log level "+level, func(t *testing.T) {
			_, err := main.ParseConfig(append(ok, "--log-level="+level), env())
			require.NoError(t, err)
		})
	}
	t.Run("liveness flags", func(t *testing.T) {
		cfg, warnings, err := main.ParseConfigWarnings(append(ok, "--liveness-interval=5s", "--liveness-threshold=15s", "--enable-discovery=false"), env())
		require.NoError(t, err)
		assert.Equal(t, 15*time.Second, cfg.LivenessThreshold)
		require.Len(t, warnings, 1)
		assert.Contains(t, warnings[0], "--liveness-interval=5s has no effect")
	})
	t.Run("discovery on by default, off without credentials, with a warning", func(t *testing.T) {
		cfg, warnings, err := main.ParseConfigWarnings(ok, env())
		require.NoError(t, err)
		assert.Nil(t, cfg.Discovery)
		require.Len(t, warnings, 1)
		assert.Contains(t, warnings[0], "discovery is off, serving --endpoints alone")
		assert.Contains(t, warnings[0], "--enable-discovery=false to silence this")
	})
	t.Run("discovery off, no warning", func(t *testing.T) {
		_, warnings, err := main.ParseConfigWarnings(append(ok, "--enable-discovery=false"), env())
		require.NoError(t, err)
		assert.Empty(t, warnings)
	})
	t.Run("the warning is logged", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // run returns once started
		var stderr bytes.Buffer
		main.Run(ctx, append(ok, "--bind-port="+strconv.Itoa(freePort(t)), "--health-port="+strconv.Itoa(freePort(t))), env(), io.Discard, &stderr)
		assert.Contains(t, stderr.String(), "warning: discovery is off")
	})
}

// With --probe=tcp the state file is still bound to the cluster CA: a bad
// one is refused at start, once, naming where it came from, rather than
// by localproxy.New without a flag's name.
func TestStateFileCAWithTCPProbe(t *testing.T) {
	f := newFiles(t)
	stateFile := filepath.Join(t.TempDir(), "state.json")
	defer main.SetServiceAccount(f.missing, f.missing)()
	_, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--ca-file=" + f.notPEM, "--state-file=" + stateFile}, env())
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), "--ca-file"), err.Error())

	defer main.SetServiceAccount(f.missing, f.notPEM)()
	_, err = main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--state-file=" + stateFile}, env())
	require.Error(t, err)
	assert.ErrorContains(t, err, `invalid --state-file="`+stateFile+`": the state file is bound to the cluster by its CA, and the in-cluster service account's, `+f.notPEM+`, is no CA bundle`)

	cfg, err := main.ParseConfig([]string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--ca-file=" + f.ca, "--state-file=" + stateFile}, env())
	require.NoError(t, err)
	assert.Equal(t, stateFile, cfg.StateFile)
	assert.NotEmpty(t, cfg.StateFileCA)
}

// A variable that disagrees with a flag given on the command line is
// ignored, the flag winning, with a warning naming both.
func TestVariableBesideFlag(t *testing.T) {
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--enable-discovery=false"}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want []string // the warnings
	}{
		{"disagrees", append(ok, "--rise=3"), []string{"LOCALPROXY_RISE", "5"}, []string{
			"LOCALPROXY_RISE=5 (--rise) is ignored: --rise=3 is given on the command line, and the flag wins"}},
		{"string", append(ok, "--log-format=json"), []string{"LOCALPROXY_LOG_FORMAT", "text"}, []string{
			`LOCALPROXY_LOG_FORMAT="text" (--log-format) is ignored: --log-format="json" is given on the command line, and the flag wins`}},
		{"same duration in another spelling", append(ok, "--health-interval=2s"), []string{"LOCALPROXY_HEALTH_INTERVAL", "2000ms"}, nil},
		{"same value", append(ok, "--rise=3"), []string{"LOCALPROXY_RISE", "3"}, nil},
		{"NODE_NAME beside --node-name", append(ok, "--node-name=node-a", "--zone=z"), []string{"NODE_NAME", "node-b"}, []string{
			`NODE_NAME="node-b" (--node-name) is ignored: --node-name="node-a" is given on the command line, and the flag wins`}},
		{"NODE_NAME beside its LOCALPROXY_ variable", append(ok, "--zone=z"), []string{"NODE_NAME", "node-b", "LOCALPROXY_NODE_NAME", "node-a"}, []string{
			`NODE_NAME="node-b" (--node-name) is ignored: LOCALPROXY_NODE_NAME="node-a" (--node-name) is set, and wins`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, warnings, err := main.ParseConfigWarnings(tc.args, env(tc.env...))
			require.NoError(t, err)
			assert.Equal(t, tc.want, warnings)
		})
	}
	cfg, err := main.ParseConfig(append(ok, "--rise=3"), env("LOCALPROXY_RISE", "5"))
	require.NoError(t, err)
	assert.Equal(t, 3, cfg.Pool.Rise, "the flag wins")
	var stderr bytes.Buffer
	code := main.Run(t.Context(), []string{"state-dir", "--owner=1:1"}, env("LOCALPROXY_OWNER", "2:2"), io.Discard, &stderr)
	assert.Equal(t, main.ExitUsage, code)
	assert.Contains(t, stderr.String(), `localproxy state-dir: warning: LOCALPROXY_OWNER="2:2" (--owner) is ignored: --owner="1:1" is given on the command line, and the flag wins`)
}

// Exec plugins and auth providers are run for discovery, not for probes
// (endpoint.Prober.WithCredentials): with only those, the probes' GET
// /readyz goes anonymous, and clusters with anonymous auth off answer it
// with 401. Said at start, naming the kubeconfig and its user.
func TestKubeconfigPluginCredentials(t *testing.T) {
	f := newFiles(t)
	defer main.SetServiceAccount(f.missing, f.missing)()
	write := func(user string) string {
		p := filepath.Join(t.TempDir(), "kubeconfig")
		require.NoError(t, os.WriteFile(p, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.96.0.1:443", certificate-authority: `+f.ca+`}
users:
- name: other
  user: {token: secret}
- name: kubelet
  user: `+user+`
contexts:
- name: c
  context: {cluster: c, user: kubelet}
current-context: c
`), 0o600))
		return p
	}
	exec := write(`{exec: {apiVersion: client.authentication.k8s.io/v1, command: /usr/bin/get-token, interactiveMode: Never}}`)
	authProvider := write(`{auth-provider: {name: oidc, config: {idp-issuer-url: "https://issuer.example.com", client-id: k}}}`)
	execAndToken := write(`{token: secret, exec: {apiVersion: client.authentication.k8s.io/v1, command: /usr/bin/get-token, interactiveMode: Never}}`)
	for _, tc := range []struct {
		name       string
		kubeconfig string
		probe      string
		want       string // "" for no warning
	}{
		{"exec, held", exec, "held", `the probes (--probe="held") go without credentials: user "kubelet" of --kubeconfig="` + exec + `" has only an exec plugin (/usr/bin/get-token), which is run for discovery but not for probes; clusters with anonymous auth off answer their GET /readyz with 401. Give the user a token, token file or client certificate, or use --probe=tls or tcp`},
		{"auth provider, readyz", authProvider, "readyz", `the probes (--probe="readyz") go without credentials: user "kubelet" of --kubeconfig="` + authProvider + `" has only an auth provider (oidc), which is run for discovery but not for probes`},
		{"exec, tls: no request", exec, "tls", ""},
		{"exec beside a token", execAndToken, "held", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, warnings, err := main.ParseConfigWarnings([]string{"--endpoints=10.0.0.1:6443", "--ca-file=" + f.ca, "--kubeconfig=" + tc.kubeconfig, "--probe=" + tc.probe}, env())
			require.NoError(t, err)
			if tc.want == "" {
				assert.Empty(t, warnings)
				return
			}
			require.Len(t, warnings, 1)
			assert.Contains(t, warnings[0], tc.want)
		})
	}
}

// Under systemd (Type=notify, WatchdogSec=): READY=1 once the proxy
// accepts, WATCHDOG=1 while it runs, STOPPING=1 as it shuts down.
func TestRunNotifiesSystemd(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sock := filepath.Join(t.TempDir(), "notify")
	sd, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	require.NoError(t, err)
	defer sd.Close()
	port := freePort(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var logs syncBuffer
	go func() {
		done <- main.Run(ctx, []string{"--endpoints=" + up.Addr().String(), "--probe=tcp", "--rise=1",
			"--bind-port=" + strconv.Itoa(port), "--health-port=" + strconv.Itoa(freePort(t))}, env("NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "400000"), io.Discard, &logs)
	}()
	read := func() string {
		sd.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, err := sd.Read(buf)
		require.NoError(t, err, "logs:\n%s", logs.String())
		return string(buf[:n])
	}
	ready := read()
	assert.True(t, strings.HasPrefix(ready, "READY=1\nSTATUS="), "%q", ready)
	assert.Contains(t, ready, "API servers healthy")
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err, "READY=1 came before the proxy listened")
	c.Close()
	assert.True(t, strings.HasPrefix(read(), "WATCHDOG=1"))
	cancel()
	for {
		m := read()
		if strings.HasPrefix(m, "STOPPING=1") {
			break
		}
		assert.True(t, strings.HasPrefix(m, "WATCHDOG=1"), "%q", m)
	}
	select {
	case code := <-done:
		assert.Equal(t, main.ExitOK, code)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return")
	}

	// A NOTIFY_SOCKET it cannot use is logged, naming it, and the proxy
	// runs without notifications: a node's API path is not refused over
	// them.
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	var logs2 syncBuffer
	go func() {
		done <- main.Run(ctx, []string{"--endpoints=" + up.Addr().String(), "--probe=tcp", "--bind-port=" + strconv.Itoa(port),
			"--health-port=" + strconv.Itoa(freePort(t))}, env("NOTIFY_SOCKET", "notify"), io.Discard, &logs2)
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs2.String(), "proxy listening") }, 10*time.Second, 10*time.Millisecond, "%s", logs2.String())
	assert.Contains(t, logs2.String(), `not notifying systemd" err="NOTIFY_SOCKET=\"notify\": want the path of a Unix datagram socket`)
	cancel()
	assert.Equal(t, main.ExitOK, <-done)
}
