package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	flag "github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"

	"github.com/apifailover/apifailover/localproxy"
)

// runStatus implements "localproxy status": GET /status from the health
// server and print it as a table (or the JSON as is).
func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var o options
	var output string
	var timeout time.Duration
	fs := flag.NewFlagSet("localproxy status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.healthBindAddress, "health-bind-address", "127.0.0.1", "IP address of the proxy's health server")
	fs.IntVar(&o.healthPort, "health-port", 7446, "port of the proxy's health server")
	fs.StringVar(&output, "output", "table", "table or json")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	if err := parseFlags(fs, &o, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		printErrors(stderr, "localproxy status", err)
		return exitUsage
	}
	printWarnings(stderr, "localproxy status", o.warnings)
	if output != "table" && output != "json" {
		fmt.Fprintf(stderr, "localproxy status: %v\n", o.bad("output", output, "want table or json"))
		return exitUsage
	}
	if timeout <= 0 {
		fmt.Fprintf(stderr, "localproxy status: %v\n", o.bad("timeout", timeout, "want a positive duration, e.g. 5s"))
		return exitUsage
	}
	if o.healthPort < 1 || o.healthPort > 65535 {
		fmt.Fprintf(stderr, "localproxy status: %v\n", o.bad("health-port", o.healthPort, "want a port number 1-65535"))
		return exitUsage
	}
	host := o.healthBindAddress
	if host == "0.0.0.0" || host == "::" || host == "" {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(o.healthPort)) + "/status"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "localproxy status: %v\n", err)
		return exitError
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "localproxy status: %v\n", err)
		return exitError
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "localproxy status: GET %s: %s %v\n", url, resp.Status, err)
		return exitError
	}
	if output == "json" {
		stdout.Write(body)
		return exitOK
	}
	var st localproxy.Status
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "localproxy status: decoding %s: %v\n", url, err)
		return exitError
	}
	printStatus(stdout, st, time.Now())
	return exitOK
}

// printStatus writes st as a table, best endpoint first.
func printStatus(w io.Writer, st localproxy.Status, now time.Time) {
	ready := "no"
	if st.Ready {
		ready = "yes"
	}
	if st.ShuttingDown {
		ready += " (shutting down)"
	}
	fmt.Fprintf(w, "origin: %s   ready: %s   connections: %d   listening: %s   pid: %d\n", st.Origin, ready, st.ActiveConnections, strings.Join(st.Listeners, ", "), st.PID)
	fmt.Fprintf(w, "zone: %s\n\n", zoneLine(st))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSTATE\tSOURCES\tLOCALITY\tZONE\tRTT\tCONNS\tSINCE\tLAST ERROR")
	for _, u := range st.Upstreams {
		state := u.State
		switch {
		case u.Preferred:
			state += " *"
		case u.Draining:
			state += " (draining)"
		case u.Suspect:
			state += " (suspect)"
		case u.Slow:
			state += " (slow)"
		}
		locality, zone := "-", "-"
		switch {
		case u.Local:
			locality = "local"
		case st.Zone != "" && u.Zone == st.Zone:
			locality = "same-zone"
		}
		if u.Zone != "" {
			zone = u.Zone
		}
		rtt := "-"
		if u.RTT > 0 {
			rtt = u.RTT.Round(10 * time.Microsecond).String()
		}
		since := "-"
		if !u.Since.IsZero() {
			since = now.Sub(u.Since).Round(time.Second).String() + " ago"
		}
		lastErr := u.LastError
		if lastErr == "" {
			lastErr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", u.Addr, state, u.Sources, locality, zone, rtt, u.Conns, since, lastErr)
	}
	for _, u := range st.Removed {
		closing := "closing now"
		if !u.CloseBy.IsZero() {
			closing = "closed in " + max(u.CloseBy.Sub(now), 0).Round(time.Second).String() + " at the latest"
		}
		fmt.Fprintf(tw, "%s\tremoved (draining)\t-\t-\t-\t-\t%d\t-\t%s\n", u.Addr, u.Conns, closing)
	}
	tw.Flush()
	fmt.Fprintln(w, "\n* preferred: new connections go there first")
}

// zoneLine says the proxy's zone and where it came from, or why there is
// none.
func zoneLine(st localproxy.Status) string {
	switch {
	case st.ZoneSource == localproxy.ZoneFromConfig:
		return st.Zone + " (--zone)"
	case st.Zone != "":
		return fmt.Sprintf("%s (label %s of node %s)", st.Zone, corev1.LabelTopologyZone, st.Node)
	case st.Node != "" && st.ZoneProblem != "":
		return "none (" + st.ZoneProblem + ")"
	case st.Node != "":
		return "none yet (reading node " + st.Node + ")"
	}
	return "none"
}
