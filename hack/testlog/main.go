// Command testlog reads `go test -json` on standard input and writes the
// text `go test -v` would have written, as it comes (test2json keeps
// some of it: === NAME lines are made again here, naming the package too
// where the lines of packages run side by side meet; subtests' --- lines
// come unindented, as each ends). At the end, when tests failed, it
// names them again with their own top-level lines (what t.Log and
// t.Error print at one indent, and a panic's or a timeout's first line;
// not the timelines and dumps indented under them), so that the tail of
// a long log, which is all a CI page may show, says what failed and why.
// A test that was running when its binary timed out, panicked or exited
// is named as failed. Lines that are not JSON (a build error, a panic
// before the test binary ran) pass through as they are.
//
//	go test -json ./hack/... 2>&1 | go run ./hack/testlog
//
// It exits 0 whatever the tests did: the caller takes go test's status
// (bash: ${PIPESTATUS[0]}).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// keepLines bounds the top-level lines kept for each test (its last ones)
// and for each package outside its tests.
const keepLines = 40

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	w := bufio.NewWriter(out)
	c := newCollector()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		w.WriteString(c.line(sc.Bytes()))
		// A line at a time: a long test's progress shows as it runs.
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading go test -json: %w", err)
	}
	c.writeFailures(w)
	return w.Flush()
}

// event is a line of `go test -json` (cmd/test2json). Build output comes
// with ImportPath instead of Package.
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
}

// key names a test in a package; Test is empty for the package's own
// lines (its pass or fail line, output from TestMain).
type key struct{ Package, Test string }

func (k key) String() string {
	if k.Test == "" {
		return k.Package
	}
	return k.Package + " " + k.Test
}

type collector struct {
	lines   map[key][]string // the last keepLines top-level lines of each
	partial map[key]string   // a line test2json split, until its end
	// running holds the tests that started and have not ended, in the
	// order they started: a test running when its binary timed out,
	// panicked or exited gets no end of its own.
	running []key
	failed  []key // tests and packages that failed, in order, once each
	last    key   // whose output came last, for === NAME lines
	open    bool  // what was printed last did not end its line
}

func newCollector() *collector {
	return &collector{lines: make(map[key][]string), partial: make(map[key]string)}
}

// line takes one input line and returns the text to print for it.
func (c *collector) line(b []byte) string {
	var ev event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &ev) != nil {
		return c.print("", string(b)+"\n", true)
	}
	k := key{ev.Package, ev.Test}
	if k.Package == "" {
		k.Package = ev.ImportPath
	}
	switch ev.Action {
	case "run":
		c.running = append(c.running, k)
	case "output", "build-output":
		text, name := ev.Output, ""
		switch {
		case c.last.Package != "" && k.Package != c.last.Package:
			// go test -json runs packages side by side and their lines
			// meet, which go test -v, printing a package's whole once it
			// ends, never shows: the package is named where they do.
			name = "=== NAME  " + strings.TrimSpace(ev.Test+"  ("+k.Package+")") + "\n"
		case ev.Test != "" && k != c.last && !strings.HasPrefix(text, "=== ") && !strings.HasPrefix(strings.TrimLeft(text, " "), "--- "):
			// go test -v names the test whose output follows another's
			// (a parallel test, a parent after its subtest); test2json
			// takes those lines in.
			name = "=== NAME  " + ev.Test + "\n"
		}
		c.last = k
		c.keep(k, ev.Output)
		return c.print(name, text, name != "")
	case "pass", "skip":
		c.end(k)
	case "fail", "build-fail":
		if k.Test == "" {
			// Its tests that never ended failed with it (a timeout, a
			// panic, an exit): named before it.
			for _, r := range c.running {
				if r.Package == k.Package {
					c.fail(r)
				}
			}
		}
		c.fail(k)
	}
	return ""
}

// print returns text to print, after name (an === NAME line, or
// none), starting a line of its own if own: test2json gives a long line
// in pieces, and another package's lines, or go's own, may come between
// them.
func (c *collector) print(name, text string, own bool) string {
	if c.open && own {
		name = "\n" + name
	}
	out := name + text
	c.open = out != "" && !strings.HasSuffix(out, "\n")
	return out
}

// keep adds out, a piece of output, to k's lines: test2json splits a long
// line into pieces, which are joined here before the line is judged.
func (c *collector) keep(k key, out string) {
	out = c.partial[k] + out
	delete(c.partial, k)
	for out != "" {
		l, rest, whole := strings.Cut(out, "\n")
		if !whole {
			c.partial[k] = l
			return
		}
		out = rest
		if keepLine(l, k.Test != "") {
			ls := append(c.lines[k], l)
			c.lines[k] = ls[max(len(ls)-keepLines, 0):]
		}
	}
}

// keepLine reports whether a line of output is worth repeating: a test's
// line at one indent (t.Log, t.Error; not the lines indented under them,
// not its === and --- lines) or a panic's first line (a panic, a
// timeout), or any line of a package's own.
func keepLine(l string, inTest bool) bool {
	if !inTest {
		return strings.TrimSpace(l) != ""
	}
	if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
		return true
	}
	rest, ok := strings.CutPrefix(l, "    ")
	return ok && rest != "" && rest[0] != ' ' && !strings.HasPrefix(rest, "--- ")
}

// end takes k off the running tests.
func (c *collector) end(k key) {
	if i := slices.Index(c.running, k); i >= 0 {
		c.running = slices.Delete(c.running, i, i+1)
	}
}

// fail records k's failure, once.
func (c *collector) fail(k key) {
	c.end(k)
	if !slices.Contains(c.failed, k) {
		c.failed = append(c.failed, k)
	}
}

// writeFailures names the failed tests, in the order they ended, and
// repeats their lines (with a line test2json left unfinished). A test
// whose subtest failed is only named, its own lines not repeated (a
// parent's are mostly set-up logs, which would push its subtests' out of
// the log's tail; its subtest, which ended before it, says why); so is a
// package when a test of it failed.
func (c *collector) writeFailures(w io.Writer) {
	parent := make([]bool, len(c.failed))
	leaves := 0
	for i, k := range c.failed {
		if parent[i] = c.hasFailedChild(k); !parent[i] {
			leaves++
		}
	}
	if leaves == 0 {
		return
	}
	fmt.Fprintf(w, "\n==> %d failed, with their own lines again:\n", leaves)
	for i, k := range c.failed {
		if parent[i] {
			fmt.Fprintf(w, "--- FAIL: %s (for what failed in it, see above)\n", k)
			continue
		}
		fmt.Fprintf(w, "--- FAIL: %s\n", k)
		for _, l := range c.lines[k] {
			fmt.Fprintln(w, l)
		}
		if p := c.partial[k]; p != "" && keepLine(p, k.Test != "") {
			fmt.Fprintln(w, p)
		}
	}
}

// hasFailedChild reports whether a test (or package) has a failed
// subtest (or test).
func (c *collector) hasFailedChild(k key) bool {
	for _, f := range c.failed {
		if f.Package != k.Package || f == k {
			continue
		}
		if k.Test == "" || strings.HasPrefix(f.Test, k.Test+"/") {
			return true
		}
	}
	return false
}
