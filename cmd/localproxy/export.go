package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/upstream"
)

// The export keeps an external load balancer's backends equal to the API
// servers localproxy counts healthy (the kube-service-exporter pattern):
// --export-template renders the set to --export-file, and
// --export-command reloads whatever reads it.

// Defaults of the export.
const (
	defaultExportDebounce = time.Second
	// exportCommandTimeout bounds one run of --export-command.
	exportCommandTimeout = 30 * time.Second
	// exportRetry is the wait before a failed write or command is tried
	// again, when nothing changed meanwhile.
	exportRetry = 5 * time.Second
)

// ExportData is what an export template sees.
type ExportData struct {
	// Origin is the API servers' certificate name (--tls-server-name).
	Origin string
	// Endpoints are the healthy API servers, sorted by address. Never
	// empty: while none is healthy the last healthy set stays exported,
	// since an empty backend would turn the load balancer away from every
	// server at once.
	Endpoints []ExportEndpoint
}

// ExportEndpoint is one API server of ExportData.
type ExportEndpoint struct {
	// Addr is host:port; IPv6 hosts are bracketed.
	Addr string
	// Host is the address or DNS name without brackets, Port the port.
	Host, Port string
	// Name is Addr made safe as an identifier: letters, digits, '-' and
	// '_' (HAProxy server names, nginx comments).
	Name string
	// Zone is the endpoint's topology zone, if known.
	Zone string
}

// exporter renders the healthy endpoint set on every change.
type exporter struct {
	tmpl     *template.Template
	file     string
	command  string // run with sh -c; "" runs nothing
	debounce time.Duration
	retry    time.Duration // after a failed write or command
	origin   string
	pool     *upstream.Pool
	log      logr.Logger
	// last is what was last written and reloaded successfully; used by
	// run only.
	last []byte
}

// parseExportTemplate reads and parses an export template.
func parseExportTemplate(path string) (*template.Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return template.New(path).Option("missingkey=error").Parse(string(b))
}

// exportData builds the template's data from the pool's endpoints; ok is
// false when none is healthy.
func exportData(origin string, sts []upstream.Status) (d ExportData, ok bool) {
	d.Origin = origin
	for _, st := range sts {
		if st.State != upstream.StateHealthy {
			continue
		}
		host, port, err := net.SplitHostPort(st.Addr)
		if err != nil {
			continue
		}
		d.Endpoints = append(d.Endpoints, ExportEndpoint{Addr: st.Addr, Host: host, Port: port, Name: exportName(st.Addr), Zone: st.Zone})
	}
	slices.SortFunc(d.Endpoints, func(a, b ExportEndpoint) int { return strings.Compare(a.Addr, b.Addr) })
	return d, len(d.Endpoints) > 0
}

// exportName maps addr to letters, digits, '-' and '_'.
func exportName(addr string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, addr)
}

// render executes the template on the pool's current state; ok is false
// when no endpoint is healthy (nothing to export).
func (e *exporter) render() (out []byte, ok bool, err error) {
	d, ok := exportData(e.origin, e.pool.Status())
	if !ok {
		return nil, false, nil
	}
	var buf bytes.Buffer
	if err := e.tmpl.Execute(&buf, d); err != nil {
		return nil, true, fmt.Errorf("rendering %s: %w", e.tmpl.Name(), err)
	}
	return buf.Bytes(), true, nil
}

// run exports until ctx is done: after each pool event, once the events
// have paused for the debounce time, it renders, and when the result
// differs from what was exported last, writes the file and runs the
// command. A failed write or command is retried.
func (e *exporter) run(ctx context.Context) {
	kick := make(chan struct{}, 1)
	unsubscribe := e.pool.Subscribe(func(upstream.Event) {
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	defer unsubscribe()
	// Whatever is in the file now was not necessarily written by this
	// process: the first export always runs the command.
	timer := time.NewTimer(e.debounce)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
			// Wait for the events to pause.
			timer.Reset(e.debounce)
			continue
		case <-timer.C:
		}
		if err := e.export(ctx); err != nil {
			e.log.Error(err, "export failed; trying again", "file", e.file, "in", e.retry)
			timer.Reset(e.retry)
		}
	}
}

// export writes and reloads once if the rendering changed.
func (e *exporter) export(ctx context.Context) error {
	out, ok, err := e.render()
	if err != nil || !ok || bytes.Equal(out, e.last) {
		return err
	}
	if err := writeOut(e.file, out); err != nil {
		return err
	}
	if e.command != "" {
		cctx, cancel := context.WithTimeout(ctx, exportCommandTimeout)
		defer cancel()
		cmd := exec.CommandContext(cctx, "/bin/sh", "-c", e.command)
		cmd.WaitDelay = time.Second
		b, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("--export-command %q: %w: %s", e.command, err, bytes.TrimSpace(b))
		}
	}
	e.last = out
	d, _ := exportData(e.origin, e.pool.Status())
	addrs := make([]string, len(d.Endpoints))
	for i, ep := range d.Endpoints {
		addrs[i] = ep.Addr
	}
	e.log.Info("exported the healthy API servers", "file", e.file, "endpoints", addrs, "command", e.command != "")
	return nil
}

// export checks --export-template, --export-file,
// --export-command and --export-debounce.
func (b *builder) export() *exporter {
	if b.exportTemplate == "" {
		for _, name := range []string{"export-file", "export-command"} {
			if _, set := b.from[name]; set {
				b.add(usagef("%s needs --export-template", b.src(name)))
			}
		}
		return nil
	}
	var e exporter
	tmpl, err := parseExportTemplate(b.exportTemplate)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		b.reject("export-template", b.exportTemplate, "want an existing text/template file")
	case err != nil:
		b.reject("export-template", b.exportTemplate, fmt.Sprintf("want a valid Go text/template: %v", err))
	}
	e.tmpl = tmpl
	if b.exportFile == "" {
		b.add(usagef("%s needs --export-file, the file to write", b.input("export-template", b.exportTemplate)))
	} else if st, err := os.Stat(b.exportFile); err == nil && st.IsDir() {
		b.reject("export-file", b.exportFile, "want a file, not a directory")
	} else if st, err := os.Stat(filepath.Dir(b.exportFile)); err != nil || !st.IsDir() {
		b.reject("export-file", b.exportFile, "want a file in an existing directory")
	}
	e.file = b.exportFile
	e.retry = exportRetry
	e.command = strings.TrimSpace(b.exportCommand)
	switch {
	case b.exportDebounce < 0:
		b.reject("export-debounce", b.exportDebounce, "want 0 (the default, "+defaultExportDebounce.String()+") or a positive duration")
	case b.exportDebounce == 0:
		e.debounce = defaultExportDebounce
	default:
		e.debounce = b.exportDebounce
	}
	return &e
}
