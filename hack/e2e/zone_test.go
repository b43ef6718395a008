package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/localproxy"
)

// zoneNode is the Node the zone subtest creates: no kubelet, just the
// object and its zone label.
const zoneNode = "zone-node-1"

// testZone: the cmd/localproxy binary, given its node's name (NODE_NAME,
// as the DaemonSet sets it) and static endpoint zones, learns its zone
// from the Node's topology.kubernetes.io/zone label, read through its own
// upstreams as the localproxy identity, and then prefers the apiserver in
// that zone over the others, although that one is the slowest (a 30ms
// shim in front of it).
//
// Every apiserver of the bed has its address on this network namespace's
// loopback, so the pool would count them all local, and locality would
// tie. The binary therefore runs in a mount namespace of its own, where
// /etc/hosts names the apiservers (api-N.e2e.test), and is given those
// names, which are never local; discovery, which would add the local
// addresses, is off (the Node is read with the same credentials).
func testZone(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	servers := bed.APIServers()
	if len(servers) < 3 {
		t.Fatalf("want 3 apiservers, have %d", len(servers))
	}
	home := servers[1] // in the node's zone, and slow
	if err := home.Slow(testbed.Slowness{Handshake: 30 * time.Millisecond, Response: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// healBed's cleanup, registered first, runs last and makes it fast.

	cs, err := kubernetes.NewForConfig(bed.RESTConfig(testbed.Origin))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: zoneNode, Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		if err := cs.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), zoneNode, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete node: %v", err)
		}
	})

	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	hosts := "127.0.0.1 localhost\n"
	names := make([]string, len(servers))
	for i, s := range servers {
		names[i] = fmt.Sprintf("api-%d.e2e.test:%d", i, testbed.APIServerPort)
		hosts += fmt.Sprintf("%s api-%d.e2e.test\n", s.Host(), i)
	}
	hostsFile := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hostsFile, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "localproxy-identity.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.Origin, testbed.LocalProxyIdentity); err != nil {
		t.Fatal(err)
	}
	// The node's zone is zone-b; the first apiserver is in zone-a, the
	// third has none given.
	endpoints := names[0] + "@zone-a," + names[1] + "@zone-b," + names[2]
	want := names[1]

	logFile, err := os.Create(filepath.Join(dir, "localproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// --probe=readyz: the premise below, that the zone-b apiserver has
	// the longest RTT, needs RTTs the shim's delays show in. Each readyz
	// probe goes through the shim's held handshake and answer every
	// second. The default held probe takes its first RTT sample from the
	// TCP connect, which the shim accepts at once, and PINGs an endpoint
	// that carries no connection every 15s, each weighing 1/8: its
	// averages can still rank the apiservers by the connects' noise after
	// 30s (seen: the zone-a apiserver's first connect, 5ms, above the
	// slowed one's average of 3ms).
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hostsFile,
		bin, "--endpoints="+endpoints, "--ca-file="+bed.CAFile(), "--tls-server-name="+bed.OriginName(),
		"--kubeconfig="+kubeconfig, "--enable-discovery=false", "--probe=readyz", "--shutdown-timeout=1s", "--log-level=2")
	cmd.Env = append(os.Environ(), "NODE_NAME="+zoneNode, "GODEBUG=netdns=go")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("localproxy after SIGTERM: %v", err)
			}
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Error("localproxy did not exit within 15s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("localproxy log:\n%s", b)
		}
	})

	e := &env{t: t, ctx: ctx, bed: bed}
	var st localproxy.Status
	var lastErr error
	ok := func() bool {
		st, lastErr = proxyStatus(ctx)
		if lastErr != nil || st.Zone != "zone-b" || len(st.Upstreams) != len(servers) {
			return false
		}
		for _, u := range st.Upstreams {
			if u.State != "healthy" || u.RTT == 0 {
				return false
			}
		}
		if st.Upstreams[0].Addr != want || !st.Upstreams[0].Preferred {
			return false
		}
		// Preferred for its zone, not its speed: once the RTT averages
		// settle, every other apiserver answers faster.
		for _, u := range st.Upstreams[1:] {
			if u.RTT >= st.Upstreams[0].RTT {
				return false
			}
		}
		return true
	}
	if err := e.waitFor("localproxy learns zone-b from node "+zoneNode+" and prefers "+want+", the slowest apiserver", observeLimit, ok); err != nil {
		b, _ := json.MarshalIndent(st, "", "  ")
		t.Fatalf("%v (last error %v); /status:\n%s", err, lastErr, b)
	}
	if st.ZoneSource != localproxy.ZoneFromNode || st.Node != zoneNode || st.ZoneProblem != "" {
		t.Errorf("zone source %q, node %q, problem %q; want node, %s, none", st.ZoneSource, st.Node, st.ZoneProblem, zoneNode)
	}
	zones := map[string]string{}
	for _, u := range st.Upstreams {
		zones[u.Addr] = u.Zone
		if u.Local {
			t.Errorf("%s counted local: the test's premise failed", u.Addr)
		}
	}
	if wantZones := map[string]string{names[0]: "zone-a", names[1]: "zone-b", names[2]: ""}; fmt.Sprint(zones) != fmt.Sprint(wantZones) {
		t.Errorf("endpoint zones %v, want %v", zones, wantZones)
	}
	t.Logf("preferred %s (zone-b, RTT %v); others: %s %v, %s %v", want, st.Upstreams[0].RTT, st.Upstreams[1].Addr, st.Upstreams[1].RTT, st.Upstreams[2].Addr, st.Upstreams[2].RTT)

	// The table and the metric say the same.
	out, err := exec.CommandContext(ctx, bin, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("localproxy status: %v\n%s", err, out)
	}
	t.Logf("localproxy status:\n%s", out)
	if !strings.Contains(string(out), "zone: zone-b (label topology.kubernetes.io/zone of node "+zoneNode+")") || !lineHas(string(out), want, "same-zone", "zone-b") {
		t.Errorf("localproxy status does not show the zone and %s in it", want)
	}
	if m, err := httpBody(ctx, "http://"+proxyHealthAddr+"/metrics"); err != nil {
		t.Error(err)
	} else if !strings.Contains(m, `apifailover_localproxy_zone_info{source="node",zone="zone-b"} 1`) {
		t.Errorf("/metrics has no zone_info for zone-b from the node")
	}
	// And it serves: kubectl through it.
	clientKubeconfig := filepath.Join(dir, "client.kubeconfig")
	if err := bed.WriteKubeconfig(clientKubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	if _, err := kubectlAt(ctx, bed, clientKubeconfig, "get", "node", zoneNode); err != nil {
		t.Error(err)
	}
}

// proxyStatus reads /status of the proxy on proxyHealthAddr.
func proxyStatus(ctx context.Context) (localproxy.Status, error) {
	var st localproxy.Status
	b, err := httpBody(ctx, "http://"+proxyHealthAddr+"/status")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal([]byte(b), &st)
}

// httpBody GETs url and returns its body, bounded by 5s.
func httpBody(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
