package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// vText is what go test -v printed: the Output of every event, and the
// lines that are not JSON as they are.
func vText(t *testing.T, input []byte) string {
	t.Helper()
	var b strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(input))
	for sc.Scan() {
		var ev event
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			b.WriteString(sc.Text() + "\n")
			continue
		}
		b.WriteString(ev.Output)
	}
	return b.String()
}

// streamed splits testlog's output into what it streamed, less the
// === NAME lines it adds, and the summary after it.
func streamed(out string) (text, summary string) {
	if i := strings.Index(out, "\n==> "); i >= 0 {
		out, summary = out[:i], out[i+1:]
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if !strings.HasPrefix(l, "=== NAME  ") {
			b.WriteString(l)
		}
	}
	return b.String(), summary
}

func TestRun(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	passed := []byte(`{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:1: fine\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p"}
`)
	why := strings.Repeat("why ", 600)
	for _, tc := range []struct {
		name  string
		input []byte
		// summary is what must follow the streamed text exactly.
		summary string
		// names are lines that must come, in this order, in the streamed
		// text: the === NAME lines go test -v prints.
		names []string
		// cut: a line test2json gave in pieces is cut by another's, where
		// the streamed text breaks it (not the events' text, then).
		cut bool
	}{
		{"passed", passed, "", nil, false},
		{"subtest failed", read("gray.json"), `==> 1 failed, with their own lines again:
--- FAIL: example.com/tl/gray TestGray/localproxy
    g_test.go:14: drop 20% of packets
    g_test.go:15: timeline:
    g_test.go:16: healthy 10.250.0.1:6443 marked down 1 times: ` + why + ` END
    g_test.go:17: figure: max_latency = 0.3 s
--- FAIL: example.com/tl/gray TestGray (for what failed in it, see above)
--- FAIL: example.com/tl/gray (for what failed in it, see above)
`, []string{"--- FAIL: TestGray/localproxy (0.00s)", "=== NAME  TestGray", "    g_test.go:19: bed closed"}, false},
		{"timed out", read("timeout.json"), `==> 1 failed, with their own lines again:
--- FAIL: example.com/tl/slow TestSlow
    s_test.go:11: waiting for the server
panic: test timed out after 1s
--- FAIL: example.com/tl/slow (for what failed in it, see above)
`, nil, false},
		{"build failed", read("build.json"), `==> 2 failed, with their own lines again:
--- FAIL: example.com/tl/b [example.com/tl/b.test]
# example.com/tl/b [example.com/tl/b.test]
b/b_test.go:5:28: undefined: undefined
--- FAIL: example.com/tl/b
FAIL	example.com/tl/b [build failed]
`, nil, false},
		{"not JSON", append([]byte("go: downloading example.com/x v1.0.0\n"), passed...), "", nil, false},
		{"a package's own line, and a long line cut by another package's", []byte(`{"Action":"run","Package":"a","Test":"TestA"}
{"Action":"output","Package":"a","Test":"TestA","Output":"    a_test.go:1: xxxx"}
{"Action":"output","Package":"b","Output":"    b_test.go:9: testbed torn down\n"}
{"Action":"output","Package":"a","Test":"TestA","Output":"yyyy end\n"}
go: a line of go's own
`), "", []string{"    a_test.go:1: xxxx", "=== NAME  (b)", "    b_test.go:9: testbed torn down", "=== NAME  TestA  (a)", "yyyy end", "go: a line of go's own"}, true},
		{"packages side by side", []byte(`{"Action":"run","Package":"a","Test":"TestA"}
{"Action":"output","Package":"a","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"a","Test":"TestA","Output":"    a_test.go:1: bed up\n"}
{"Action":"run","Package":"b","Test":"TestB"}
{"Action":"output","Package":"b","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"a","Test":"TestA","Output":"    a_test.go:2: scenario 1\n"}
{"Action":"output","Package":"a","Test":"TestA","Output":"--- PASS: TestA (1.00s)\n"}
{"Action":"pass","Package":"a","Test":"TestA"}
{"Action":"output","Package":"a","Output":"ok  \ta\t1.0s\n"}
{"Action":"pass","Package":"a"}
{"Action":"output","Package":"b","Test":"TestB","Output":"    b_test.go:1: waiting for the bed\n"}
`), "", []string{"=== RUN   TestA", "    a_test.go:1: bed up", "=== NAME  TestB  (b)", "=== RUN   TestB", "=== NAME  TestA  (a)", "    a_test.go:2: scenario 1", "ok  \ta\t1.0s", "=== NAME  TestB  (b)", "    b_test.go:1: waiting for the bed"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(bytes.NewReader(tc.input), &out); err != nil {
				t.Fatal(err)
			}
			text, summary := streamed(out.String())
			if want := vText(t, tc.input); text != want && !tc.cut {
				t.Errorf("streamed:\n%s\nwant:\n%s", text, want)
			}
			if summary != tc.summary {
				t.Errorf("summary:\n%s\nwant:\n%s", summary, tc.summary)
			}
			rest := "\n" + out.String()
			for _, l := range tc.names {
				i := strings.Index(rest, "\n"+l+"\n")
				if i < 0 {
					t.Fatalf("no line %q (in this order) in:\n%s", l, out.String())
				}
				rest = rest[i+len(l)+1:]
			}
		})
	}
}

// TestKeepLines: a test's last keepLines top-level lines are repeated,
// no more.
func TestKeepLines(t *testing.T) {
	var in strings.Builder
	for i := range keepLines + 5 {
		b, _ := json.Marshal(event{Action: "output", Package: "p", Test: "TestA", Output: "    a_test.go:1: line " + strings.Repeat("x", i) + "\n"})
		in.Write(append(b, '\n'))
	}
	in.WriteString(`{"Action":"fail","Package":"p","Test":"TestA"}` + "\n")
	var out bytes.Buffer
	if err := run(strings.NewReader(in.String()), &out); err != nil {
		t.Fatal(err)
	}
	_, summary, ok := strings.Cut(out.String(), "==> 1 failed")
	if !ok {
		t.Fatalf("no summary in:\n%s", out.String())
	}
	if n := strings.Count(summary, "a_test.go:1: line"); n != keepLines {
		t.Errorf("%d lines repeated, want %d", n, keepLines)
	}
	if strings.Contains(summary, "line \n") || !strings.Contains(summary, "line "+strings.Repeat("x", keepLines+4)+"\n") {
		t.Errorf("want the last %d lines, got:\n%s", keepLines, summary)
	}
}
