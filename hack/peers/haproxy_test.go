package peers_test

import (
	"bufio"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apifailover/apifailover/hack/peers"
)

// fakeStats serves one answer to show stat on a unix socket, as HAProxy's
// stats socket does, and returns the socket's path.
func fakeStats(t *testing.T, answer string) string {
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
				c.Write([]byte(answer))
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

func TestHAProxyStats(t *testing.T) {
	sock := fakeStats(t, showStat)
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
	serving, err := peers.HAProxyServing(sock)
	if err != nil || serving != "apiserver-2" {
		t.Fatalf("HAProxyServing = %q, %v; want apiserver-2 (its one session)", serving, err)
	}
}

func TestHAProxyServingNone(t *testing.T) {
	sock := fakeStats(t, strings.ReplaceAll(showStat, "apiserver-2,1,", "apiserver-2,0,"))
	if serving, err := peers.HAProxyServing(sock); err != nil || serving != "" {
		t.Fatalf("HAProxyServing with no session = %q, %v; want \"\"", serving, err)
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

func TestHAProxySetState(t *testing.T) {
	sock := fakeStats(t, showStat)
	if err := peers.HAProxySetState(sock, "apiserver-1", "drain"); err != nil {
		t.Fatalf("drain apiserver-1: %v", err)
	}
	if err := peers.HAProxySetState(sock, "apiserver-9", "drain"); err == nil || !strings.Contains(err.Error(), "No such server") {
		t.Fatalf("drain of an unknown server: %v, want HAProxy's answer", err)
	}
}
