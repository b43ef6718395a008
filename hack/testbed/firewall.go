package testbed

import (
	"errors"
	"strconv"
	"sync"
)

// ruleComment tags every iptables rule the bed adds.
const ruleComment = "apifailover-testbed"

// rule is one iptables rule: a table ("" is filter), a chain and the
// match/target arguments.
type rule struct {
	table string
	chain string
	spec  []string
}

// Own connections of the apiservers are exempt from faults.
//
// Everything runs in one network namespace, so an apiserver's loopback
// client (it connects to its own --bind-address) would be cut by a
// blackhole or reject of that address too. Then its kubernetes-service
// controller blocks for ~30 s per round, its master lease (15 s TTL)
// expires and the address flaps out of and back into the EndpointSlice —
// unlike a real client-side partition, where the apiserver stays listed
// Ready. So the apiservers run with group APIServerGID, their connections
// to the apiserver port get a connmark (mangle OUTPUT runs before filter
// OUTPUT, and the connmark covers both directions), and fault rules skip
// marked connections.
const (
	// APIServerGID is the group the apiservers run as (when the bed runs
	// as real root). TCP connections to port 6443 opened by processes of
	// this group are exempt from Blackhole and Reject.
	APIServerGID = 64242
	exemptMark   = "0x1000/0x1000"
)

// exemptRule marks the connections apiserver processes open to port.
func exemptRule(port int) rule {
	return rule{"mangle", "OUTPUT", []string{
		"-p", "tcp", "--dport", strconv.Itoa(port),
		"-m", "owner", "--gid-owner", strconv.Itoa(APIServerGID),
		"-j", "CONNMARK", "--set-xmark", exemptMark,
	}}
}

// relayExemptRule marks the connections a Slow shim opens to its
// apiserver (socket mark relayMark): they escape every fault, the shim's
// own redirection included, as the apiservers' own connections do.
func relayExemptRule(port int) rule {
	return rule{"mangle", "OUTPUT", []string{
		"-p", "tcp", "--dport", strconv.Itoa(port),
		"-m", "mark", "--mark", relayMark,
		"-j", "CONNMARK", "--set-xmark", exemptMark,
	}}
}

// notExempt is prepended to fault rule matches.
var notExempt = []string{"-m", "connmark", "!", "--mark", exemptMark}

// blackholeRules drop every packet to and from host:port, both directions,
// in INPUT and OUTPUT: connects and established connections time out.
func blackholeRules(host string, port int) []rule {
	p := strconv.Itoa(port)
	var rules []rule
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		rules = append(rules,
			rule{"", chain, concat([]string{"-p", "tcp", "-d", host, "--dport", p}, notExempt, []string{"-j", "DROP"})},
			rule{"", chain, concat([]string{"-p", "tcp", "-s", host, "--sport", p}, notExempt, []string{"-j", "DROP"})},
		)
	}
	return rules
}

// rejectRules answer every packet to and from host:port with a TCP reset:
// connects are refused and established connections are reset.
//
// RSTs themselves must pass: the reset REJECT sends to the client comes
// from host:port and traverses INPUT too (everything is local), so a rule
// matching it would swallow it and turn the reject into a blackhole.
func rejectRules(host string, port int) []rule {
	p := strconv.Itoa(port)
	reset := []string{"!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset"}
	return []rule{
		{"", "INPUT", concat([]string{"-p", "tcp", "-d", host, "--dport", p}, notExempt, reset)},
		{"", "INPUT", concat([]string{"-p", "tcp", "-s", host, "--sport", p}, notExempt, reset)},
	}
}

// resetRules reset connections to host:port made before a Slow shim
// (those it redirects carry conntrack state DNAT, both ways; a reply of
// the shim already has its source rewritten to host:port in INPUT).
func resetRules(host string, port int) []rule {
	p := strconv.Itoa(port)
	reset := []string{"-m", "conntrack", "!", "--ctstate", "DNAT", "!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset"}
	return []rule{
		{"", "INPUT", concat([]string{"-p", "tcp", "-d", host, "--dport", p}, notExempt, reset)},
		{"", "INPUT", concat([]string{"-p", "tcp", "-s", host, "--sport", p}, notExempt, reset)},
	}
}

// lossyRules drop packets to and from host:port at random, each with
// probability p, in INPUT only (every packet crosses it once; OUTPUT as
// well would drop twice as many).
func lossyRules(host string, port int, p float64) []rule {
	pt := strconv.Itoa(port)
	drop := []string{"-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 4, 64), "-j", "DROP"}
	return []rule{
		{"", "INPUT", concat([]string{"-p", "tcp", "-d", host, "--dport", pt}, notExempt, drop)},
		{"", "INPUT", concat([]string{"-p", "tcp", "-s", host, "--sport", pt}, notExempt, drop)},
	}
}

// firewall adds and removes the bed's iptables rules and remembers them,
// per owner (an apiserver host), so they can be removed again.
type firewall struct {
	iptables string

	mu    sync.Mutex // guards rules; held across iptables runs to keep them ordered
	rules map[string][]rule
}

func newFirewall(iptables string) *firewall {
	return &firewall{iptables: iptables, rules: map[string][]rule{}}
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func (f *firewall) iptablesArgs(op string, r rule) []string {
	args := []string{"-w", "5"}
	if r.table != "" {
		args = append(args, "-t", r.table)
	}
	args = append(args, op, r.chain)
	args = append(args, r.spec...)
	return append(args, "-m", "comment", "--comment", ruleComment)
}

// set replaces owner's rules with rules (nil removes them all).
func (f *firewall) set(owner string, rules []rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.clearLocked(owner); err != nil {
		return err
	}
	for _, r := range rules {
		if err := run(f.iptables, f.iptablesArgs("-I", r)...); err != nil {
			return err
		}
		f.rules[owner] = append(f.rules[owner], r)
	}
	return nil
}

// active reports owner's current rules.
func (f *firewall) active(owner string) []rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]rule(nil), f.rules[owner]...)
}

func (f *firewall) clearLocked(owner string) error {
	var errs []error
	var kept []rule
	for _, r := range f.rules[owner] {
		if err := run(f.iptables, f.iptablesArgs("-D", r)...); err != nil {
			errs = append(errs, err)
			kept = append(kept, r)
		}
	}
	if len(kept) == 0 {
		delete(f.rules, owner)
	} else {
		f.rules[owner] = kept
	}
	return errors.Join(errs...)
}

// clearAll removes every rule the firewall added.
func (f *firewall) clearAll() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for owner := range f.rules {
		errs = append(errs, f.clearLocked(owner))
	}
	return errors.Join(errs...)
}
