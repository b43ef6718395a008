package peers_test

import (
	"bufio"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/apifailover/apifailover/hack/peers"
)

// fakeStats serves answer() to show stat on a unix socket, as HAProxy's
// stats socket does, and returns the socket's path.
func fakeStats(t *testing.T, answer func() string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "haproxy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			switch line = strings.TrimSpace(line); {
			case line == "show stat":
				c.Write([]byte(answer()))
			case line == "set server kube_api_backend/apiserver-1 state drain":
				c.Write([]byte("\n"))
			case strings.HasPrefix(line, "set server"):
				c.Write([]byte("No such server.\n\n"))
			}
			c.Close()
		}
	}()
	return sock
}

const showStat = `# pxname,svname,scur,stot,status
kube_api_frontend,FRONTEND,1,9,OPEN
kube_api_backend,apiserver-1,0,4,DOWN
kube_api_backend,apiserver-2,1,5,UP
kube_api_backend,apiserver-3,0,0,UP 1/2
kube_api_backend,BACKEND,1,9,UP

`

func fixed(s string) func() string { return func() string { return s } }

func TestHAProxyStats(t *testing.T) {
	sock := fakeStats(t, fixed(showStat))
	states, err := peers.HAProxyServerStates(sock)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"apiserver-1": "DOWN", "apiserver-2": "UP", "apiserver-3": "UP 1/2"}
	if len(states) != len(want) {
		t.Fatalf("states = %v, want %v", states, want)
	}
	for k, v := range want {
		if states[k] != v {
			t.Errorf("states[%s] = %q, want %q", k, states[k], v)
		}
	}
	if serving := peers.HAProxyServing(sock)(); serving != "apiserver-2" {
		t.Fatalf("HAProxyServing = %q, want apiserver-2 (its one session)", serving)
	}
}

// TestHAProxyServingMoves: a connection stuck on apiserver-1 (hung) stays
// open beside the client's new one on apiserver-3: the new one is where
// the client is.
func TestHAProxyServingMoves(t *testing.T) {
	var mu sync.Mutex
	answer := showStat
	sock := fakeStats(t, func() string { mu.Lock(); defer mu.Unlock(); return answer })
	set := func(s string) { mu.Lock(); answer = s; mu.Unlock() }
	serving := peers.HAProxyServing(sock)
	set(`# pxname,svname,scur,stot,status
kube_api_backend,apiserver-1,1,1,UP
kube_api_backend,apiserver-3,0,0,UP
`)
	if s := serving(); s != "apiserver-1" {
		t.Fatalf("before the fault: %q, want apiserver-1", s)
	}
	set(`# pxname,svname,scur,stot,status
kube_api_backend,apiserver-1,1,1,UP
kube_api_backend,apiserver-3,1,1,UP
`)
	if s := serving(); s != "apiserver-3" {
		t.Fatalf("with a stuck session on apiserver-1 and a new one on apiserver-3: %q, want apiserver-3", s)
	}
	set(`# pxname,svname,scur,stot,status
kube_api_backend,apiserver-1,0,1,UP
kube_api_backend,apiserver-3,0,1,UP
`)
	if s := serving(); s != "" {
		t.Fatalf("with no session: %q, want \"\"", s)
	}
}

func TestHAProxySetState(t *testing.T) {
	sock := fakeStats(t, fixed(showStat))
	if err := peers.HAProxySetState(sock, "apiserver-1", "drain"); err != nil {
		t.Fatalf("drain apiserver-1: %v", err)
	}
	if err := peers.HAProxySetState(sock, "apiserver-9", "drain"); err == nil || !strings.Contains(err.Error(), "No such server") {
		t.Fatalf("drain of an unknown server: %v, want HAProxy's answer", err)
	}
}

func TestHAProxyConfigKubespray(t *testing.T) {
	cfg := peers.HAProxyConfig(peers.HAProxyListen, []string{"apiserver-2", "apiserver-1"}, []string{"10.250.0.2:6443", "10.250.0.1:6443"}, "/run/h.sock", 0)
	for _, want := range []string{
		"bind 127.0.0.1:6443",
		"balance leastconn",
		"option httpchk GET /healthz",
		"default-server inter 15s downinter 15s rise 2 fall 2 slowstart 60s maxconn 1000",
		"server apiserver-2 10.250.0.2:6443 check check-ssl verify none\n    server apiserver-1 10.250.0.1:6443",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("configuration lacks %q:\n%s", want, cfg)
		}
	}
}
