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

func TestRun(t *testing.T) {
	gray, err := os.ReadFile("testdata/gray.json")
	if err != nil {
		t.Fatal(err)
	}
	build, err := os.ReadFile("testdata/build.json")
	if err != nil {
		t.Fatal(err)
	}
	passed := []byte(`{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:1: fine\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p"}
`)
	for _, tc := range []struct {
		name  string
		input []byte
		// summary is what must follow the -v text exactly.
		summary string
	}{
		{"passed", passed, ""},
		{"subtest failed", gray, `
==> failed (3), with their own lines again:
--- FAIL: example.com/tl/p TestGray/localproxy
    p_test.go:10: drop 20% of packets
    p_test.go:11: timeline:
    p_test.go:12: healthy 10.250.0.1:6443 marked down 1 times
    p_test.go:13: figure: max_latency = 0.3 s
--- FAIL: example.com/tl/p TestGray (for what failed in it, see above)
--- FAIL: example.com/tl/p (for what failed in it, see above)
`},
		{"build failed", build, `
==> failed (2), with their own lines again:
--- FAIL: example.com/tl/b [example.com/tl/b.test]
# example.com/tl/b [example.com/tl/b.test]
b/b_test.go:5:28: undefined: undefined
--- FAIL: example.com/tl/b
FAIL	example.com/tl/b [build failed]
`},
		{"not JSON", append([]byte("go: downloading example.com/x v1.0.0\n"), passed...), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(bytes.NewReader(tc.input), &out); err != nil {
				t.Fatal(err)
			}
			want := vText(t, tc.input) + tc.summary
			if got := out.String(); got != want {
				t.Errorf("output:\n%s\nwant:\n%s", got, want)
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
	_, summary, ok := strings.Cut(out.String(), "==> failed (1)")
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
