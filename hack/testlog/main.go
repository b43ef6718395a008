// Command testlog reads `go test -json` on standard input and writes the
// text `go test -v` would have written, as it comes. At the end, when
// tests failed, it names them again with their own top-level lines (what
// t.Log and t.Error print at one indent, not the timelines and dumps
// under them), so that the tail of a long log, which is all a CI page may
// show, says what failed and why. Lines that are not JSON (a build error,
// a panic before the test binary ran) pass through as they are.
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

type collector struct {
	lines  map[key][]string // the last keepLines top-level lines of each test
	failed []key            // tests and packages that failed, in order
}

func newCollector() *collector { return &collector{lines: make(map[key][]string)} }

// line takes one input line and returns the text to print for it.
func (c *collector) line(b []byte) string {
	var ev event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &ev) != nil {
		return string(b) + "\n"
	}
	k := key{ev.Package, ev.Test}
	if k.Package == "" {
		k.Package = ev.ImportPath
	}
	switch ev.Action {
	case "output", "build-output":
		if topLevel(ev.Output, ev.Test != "") {
			l := append(c.lines[k], strings.TrimRight(ev.Output, "\n"))
			c.lines[k] = l[max(len(l)-keepLines, 0):]
		}
		return ev.Output
	case "fail", "build-fail":
		c.failed = append(c.failed, k)
	}
	return ""
}

// topLevel reports whether a line of output is worth repeating: a test's
// line at one indent (t.Log, t.Error; not the lines indented under them,
// not its === and --- lines), or any line of a package's own.
func topLevel(s string, inTest bool) bool {
	if !inTest {
		return strings.TrimSpace(s) != ""
	}
	rest, ok := strings.CutPrefix(s, "    ")
	return ok && rest != "" && rest[0] != ' ' && rest[0] != '\n' && !strings.HasPrefix(rest, "--- ")
}

// writeFailures names the failed tests, in the order they ended, and
// repeats their lines. A test whose subtest failed is only named (the
// subtest, which ended before it, says why); so is a package when a test
// of it failed.
func (c *collector) writeFailures(w io.Writer) {
	if len(c.failed) == 0 {
		return
	}
	fmt.Fprintf(w, "\n==> failed (%d), with their own lines again:\n", len(c.failed))
	for _, k := range c.failed {
		name := k.Package
		if k.Test != "" {
			name = k.Package + " " + k.Test
		}
		if c.hasFailedChild(k) {
			fmt.Fprintf(w, "--- FAIL: %s (for what failed in it, see above)\n", name)
			continue
		}
		fmt.Fprintf(w, "--- FAIL: %s\n", name)
		for _, l := range c.lines[k] {
			fmt.Fprintln(w, l)
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
