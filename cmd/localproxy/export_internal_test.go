package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

func TestExportData(t *testing.T) {
	d, ok := exportData("kubernetes.default.svc", []upstream.Status{
		{Addr: "10.0.0.2:6443", State: upstream.StateHealthy, Zone: "b"},
		{Addr: "10.0.0.9:6443", State: upstream.StateUnhealthy},
		{Addr: "[fd00::1]:6443", State: upstream.StateHealthy},
		{Addr: "api-1.example.com:443", State: upstream.StateHealthy},
		{Addr: "10.0.0.1:6443", State: upstream.StateUnknown},
	})
	require.True(t, ok)
	assert.Equal(t, "kubernetes.default.svc", d.Origin)
	assert.Equal(t, []ExportEndpoint{
		{Addr: "10.0.0.2:6443", Host: "10.0.0.2", Port: "6443", Name: "10_0_0_2_6443", Zone: "b"},
		{Addr: "[fd00::1]:6443", Host: "fd00::1", Port: "6443", Name: "_fd00__1__6443"},
		{Addr: "api-1.example.com:443", Host: "api-1.example.com", Port: "443", Name: "api-1_example_com_443"},
	}, d.Endpoints)

	_, ok = exportData("x", []upstream.Status{{Addr: "10.0.0.9:6443", State: upstream.StateUnhealthy}})
	assert.False(t, ok, "nothing healthy: nothing to export")
}

// The shipped templates render every kind of address, and the real
// HAProxy and nginx accept what they render, where installed.
func TestExportTemplates(t *testing.T) {
	d := ExportData{Origin: "kubernetes.default.svc", Endpoints: []ExportEndpoint{
		{Addr: "10.0.0.1:6443", Host: "10.0.0.1", Port: "6443", Name: "10_0_0_1_6443"},
		{Addr: "[fd00::1]:6443", Host: "fd00::1", Port: "6443", Name: "_fd00__1__6443"},
	}}
	dir := t.TempDir()
	render := func(name string) string {
		tmpl, err := parseExportTemplate(filepath.Join("deploy", "export", name))
		require.NoError(t, err)
		var b strings.Builder
		require.NoError(t, tmpl.Execute(&b, d))
		return b.String()
	}
	hb := render("haproxy-backend.tmpl")
	assert.Contains(t, hb, "    server 10_0_0_1_6443 10.0.0.1:6443 check\n")
	assert.Contains(t, hb, "    server _fd00__1__6443 fd00::1:6443 check\n")
	ng := render("nginx-upstream.tmpl")
	assert.Contains(t, ng, "    server 10.0.0.1:6443 max_fails=1 fail_timeout=5s;\n")
	assert.Contains(t, ng, "    server [fd00::1]:6443 max_fails=1 fail_timeout=5s;\n")

	if haproxy, err := exec.LookPath("haproxy"); err == nil {
		main := filepath.Join(dir, "haproxy.cfg")
		require.NoError(t, os.WriteFile(main, []byte("defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1m\n    timeout server 1m\nfrontend api\n    bind 127.0.0.1:16443\n    default_backend kube-apiserver\n"), 0o600))
		backend := filepath.Join(dir, "backend.cfg")
		require.NoError(t, os.WriteFile(backend, []byte(hb), 0o600))
		out, err := exec.Command(haproxy, "-c", "-f", main, "-f", backend).CombinedOutput()
		require.NoError(t, err, "haproxy -c: %s", out)
	} else {
		t.Log("haproxy not installed: its configuration check is skipped")
	}
	if nginx, err := exec.LookPath("nginx"); err == nil {
		up := filepath.Join(dir, "upstream.conf")
		require.NoError(t, os.WriteFile(up, []byte(ng), 0o600))
		conf := filepath.Join(dir, "nginx.conf")
		mod := ""
		if _, err := os.Stat("/usr/lib/nginx/modules/ngx_stream_module.so"); err == nil {
			mod = "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
		}
		require.NoError(t, os.WriteFile(conf, []byte(mod+"error_log stderr;\npid "+filepath.Join(dir, "nginx.pid")+";\nevents {}\nstream {\n    include "+up+";\n    server { listen 127.0.0.1:16444; proxy_pass kube_apiserver; }\n}\n"), 0o600))
		out, err := exec.Command(nginx, "-t", "-p", dir, "-c", conf, "-e", "stderr").CombinedOutput()
		require.NoError(t, err, "nginx -t: %s", out)
	} else {
		t.Log("nginx not installed: its configuration check is skipped")
	}
}

// switchProber answers each endpoint's probes as set.
type switchProber struct {
	mu   sync.Mutex
	down map[string]bool
}

func (p *switchProber) Probe(ctx context.Context, addr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down[addr] {
		return errors.New("down")
	}
	return nil
}

func (p *switchProber) set(addr string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[addr] = down
}

// The exporter follows the pool: it rewrites the file and runs the command
// as endpoints go down and come back, keeps the last set while none is
// healthy, and retries a failed command.
func TestExporterFollowsThePool(t *testing.T) {
	a, b := "10.0.0.1:6443", "10.0.0.2:6443"
	pr := &switchProber{down: map[string]bool{}}
	pool, err := upstream.New(upstream.Config{Prober: pr, Interval: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, Rise: 1, Fall: 1})
	require.NoError(t, err)
	require.NoError(t, pool.Set(upstream.SourceStatic, []upstream.Spec{{Addr: a}, {Addr: b}}))
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); pool.Run(ctx) }()

	dir := t.TempDir()
	file := filepath.Join(dir, "backend")
	reloads := filepath.Join(dir, "reloads")
	failOnce := filepath.Join(dir, "failed-once")
	e := &exporter{
		tmpl:     template.Must(template.New("t").Parse("{{range .Endpoints}}{{.Addr}} {{end}}")),
		file:     file,
		command:  "test -e " + failOnce + " || { touch " + failOnce + "; echo first reload fails >&2; exit 1; }; echo x >> " + reloads,
		debounce: 20 * time.Millisecond,
		retry:    50 * time.Millisecond,
		origin:   "o",
		pool:     pool,
	}
	go func() { defer wg.Done(); e.run(ctx) }()

	content := func() string { b, _ := os.ReadFile(file); return string(b) }
	nReloads := func() int { b, _ := os.ReadFile(reloads); return strings.Count(string(b), "x") }
	require.Eventually(t, func() bool { return content() == a+" "+b+" " && nReloads() == 1 }, 10*time.Second, 5*time.Millisecond,
		"file %q, %d reloads (the first failed and was retried)", content(), nReloads())

	pr.set(a, true)
	require.Eventually(t, func() bool { return content() == b+" " && nReloads() == 2 }, 10*time.Second, 5*time.Millisecond, "file %q", content())

	// Nothing healthy: the last set stays, no reload.
	pr.set(b, true)
	require.Eventually(t, func() bool { return !pool.Healthy() }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, b+" ", content(), "nothing healthy: the last set stays")
	pr.set(a, false)
	require.Eventually(t, func() bool { return content() == a+" " && nReloads() >= 3 }, 10*time.Second, 5*time.Millisecond, "file %q", content())
	assert.Equal(t, 3, nReloads(), "one reload per change; none for the moment nothing was healthy")
}
