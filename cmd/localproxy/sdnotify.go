package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/localproxy"
)

// systemd's service notifications (sd_notify(3)), for the unit's
// Type=notify and WatchdogSec=: the service counts as started once the
// proxy listens (READY=1), so that kubelet, ordered after it, starts
// with the proxy's port open; systemctl status shows a line on the
// API servers and connections (STATUS=); a proxy that stops being live
// (what /healthz checks: its accept loops and its health-check loop) stops
// sending WATCHDOG=1, and systemd restarts it WatchdogSec later, as
// kubelet's liveness probe restarts the DaemonSet's pod. Whether an API
// server is healthy does not count: with the whole control plane down the
// proxy is working as it should. With no NOTIFY_SOCKET (not under
// systemd, or another Type=) nothing is sent.

// notifyStatusEvery is how often STATUS= is brought up to date when no
// watchdog sets a faster pace.
const notifyStatusEvery = 10 * time.Second

// sdNotifier sends a service's notifications to systemd.
type sdNotifier struct {
	conn *net.UnixConn
	// watchdog is WATCHDOG_USEC, for this process; 0: no watchdog.
	watchdog time.Duration
}

// newSDNotifier reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (the
// latter two as sd_watchdog_enabled(3) does: for this process only when
// WATCHDOG_PID is unset or names it) and connects to the socket. nil, nil
// when NOTIFY_SOCKET is unset. An error names the variable: the caller
// logs it and runs without notifications, as sd_notify(3) advises (a
// node's API path is not to be refused over them; a Type=notify unit then
// fails its start, with that line in the journal).
func newSDNotifier(getenv func(string) string, pid int) (*sdNotifier, error) {
	name := getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil, nil
	}
	if !strings.HasPrefix(name, "/") && !strings.HasPrefix(name, "@") {
		return nil, fmt.Errorf("NOTIFY_SOCKET=%q: want the path of a Unix datagram socket or an abstract one (@name), as systemd sets it for Type=notify", name)
	}
	var watchdog time.Duration
	if v := getenv("WATCHDOG_USEC"); v != "" {
		forUs := true
		if w := getenv("WATCHDOG_PID"); w != "" {
			wpid, err := strconv.Atoi(w)
			if err != nil || wpid <= 0 {
				return nil, fmt.Errorf("WATCHDOG_PID=%q: want a process ID, as systemd sets it with WatchdogSec=", w)
			}
			forUs = wpid == pid
		}
		usec, err := strconv.ParseInt(v, 10, 64)
		if err != nil || usec <= 0 || usec > int64(time.Duration(1<<62)/time.Microsecond) {
			return nil, fmt.Errorf("WATCHDOG_USEC=%q: want a positive whole number of microseconds, as systemd sets it from WatchdogSec=", v)
		}
		if forUs {
			watchdog = time.Duration(usec) * time.Microsecond
		}
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("NOTIFY_SOCKET=%q: %w", name, err)
	}
	return &sdNotifier{conn: conn, watchdog: watchdog}, nil
}

// notifyWriteTimeout bounds a notification's write: a datagram socket
// whose reader (PID 1) does not read, frozen or busy reloading, blocks
// the writer once its queue is full, and the proxy's exit would wait.
const notifyWriteTimeout = time.Second

// send sends one notification, its assignments one per line.
func (n *sdNotifier) send(lines ...string) error {
	n.conn.SetWriteDeadline(time.Now().Add(notifyWriteTimeout))
	_, err := n.conn.Write([]byte(strings.Join(lines, "\n")))
	return err
}

// close closes the socket.
func (n *sdNotifier) close() { n.conn.Close() }

// every is the pace of the notifications while the proxy runs: half the
// watchdog's timeout, as sd_watchdog_enabled(3) advises, or
// notifyStatusEvery if that is sooner or there is no watchdog; and
// notifyStatusSoon while an API server is still to be checked (starting).
func (n *sdNotifier) every(checking bool) time.Duration {
	d := notifyStatusEvery
	if n.watchdog > 0 {
		d = min(n.watchdog/2, d)
	}
	if checking {
		d = min(notifyStatusSoon, d)
	}
	return max(d, notifyLeast)
}

// notifyLeast bounds the pace from below: a WATCHDOG_USEC of a few
// microseconds is no reason to spin.
const notifyLeast = 10 * time.Millisecond

// notifyStatusSoon is the pace of STATUS= while the first health checks
// run: systemctl status right after a (re)start says what they found
// within a second, not 10s on.
const notifyStatusSoon = time.Second

// notifiedProxy is what the notifications tell of: a *localproxy.Proxy.
type notifiedProxy interface {
	Ready() <-chan struct{}
	Live() error
	Status() localproxy.Status
}

// run sends READY=1 once p listens, then every n.every() its status and,
// while p is live, WATCHDOG=1; STOPPING=1 once ctx ends (the proxy's
// shutdown begins with it). A failed send is logged once, and the rest
// are tried all the same: systemd may come back (daemon-reexec).
func (n *sdNotifier) run(ctx context.Context, p notifiedProxy, log logr.Logger) {
	failing := false
	send := func(lines ...string) {
		err := n.send(lines...)
		if err != nil && !failing {
			log.Error(err, "systemd notification failed")
		}
		failing = err != nil
	}
	select {
	case <-ctx.Done():
		return
	case <-p.Ready():
	}
	st := p.Status()
	status := statusLine(st, nil)
	send("READY=1", "STATUS="+status)
	t := time.NewTimer(n.every(checking(st)))
	defer t.Stop()
	var dead error // what Live said last, if not live
	for {
		select {
		case <-ctx.Done():
			send("STOPPING=1", "STATUS=shutting down: draining client connections")
			return
		case <-t.C:
		}
		err := p.Live()
		switch {
		case err != nil && dead == nil:
			log.Error(err, "not live: no WATCHDOG=1 to systemd while this lasts", "watchdog", n.watchdog)
		case err == nil && dead != nil:
			log.Info("live again", "was", dead.Error())
		}
		dead = err
		lines := make([]string, 0, 2)
		if err == nil && n.watchdog > 0 {
			lines = append(lines, "WATCHDOG=1")
		}
		st := p.Status()
		if s := statusLine(st, err); s != status {
			status = s
			lines = append(lines, "STATUS="+s)
		}
		if len(lines) > 0 {
			send(lines...)
		}
		t.Reset(n.every(checking(st)))
	}
}

// checking reports whether an API server is yet to be checked.
func checking(s localproxy.Status) bool {
	for _, u := range s.Upstreams {
		if u.State == "unknown" {
			return true
		}
	}
	return false
}

// statusLine is STATUS= for systemctl status: the API servers healthy,
// the preferred one (new connections go there), and the client
// connections; or, when the proxy is not live, why.
func statusLine(s localproxy.Status, notLive error) string {
	if notLive != nil {
		return "not live: " + oneLine(notLive.Error())
	}
	healthy, unknown, preferred := 0, 0, ""
	for _, u := range s.Upstreams {
		switch u.State {
		case "healthy":
			healthy++
		case "unknown":
			unknown++
		}
		if u.Preferred && preferred == "" {
			preferred = u.Addr
		}
	}
	line := fmt.Sprintf("%d of %d API servers healthy", healthy, len(s.Upstreams))
	if unknown > 0 {
		line += fmt.Sprintf(" (%d not checked yet)", unknown)
	}
	if preferred != "" {
		line += ", preferred " + preferred
	}
	return line + fmt.Sprintf("; %d client connections", s.ActiveConnections)
}

// oneLine keeps an assignment on its line: a newline would end it.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
