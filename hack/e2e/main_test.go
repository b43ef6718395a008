// Package e2e_test is the end-to-end failover suite: real kube-apiservers
// (hack/testbed), a client workload (hack/workload) running through a
// client path under test, and faults injected into the apiserver serving
// it. Run it with `make e2e` (APIFAILOVER_E2E=1); without that (and
// outside CI) it skips when the machine is not prepared.
//
// Every scenario runs once per path (see paths_test.go) and adds a row to
// _output/e2e/summary.json at the repository root, written after the
// tests even when they fail.
package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

func TestMain(m *testing.M) {
	bedtest.Main(m, func(code int) int {
		if err := writeSummary(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: writing summary:", err)
			if code == 0 {
				code = 1
			}
		}
		return code
	})
}

// row is one line of summary.json.
type row struct {
	Scenario string `json:"scenario"`
	Path     string `json:"path"`
	Fault    string `json:"fault"`
	Passed   bool   `json:"passed"`
	// FailoverSeconds is the scenario's headline time: from the fault to
	// the first successful request through another apiserver (S6: from
	// the restarted apiserver being ready to the first successful request;
	// S7: from the new apiserver being listed to the client's pool
	// holding it).
	FailoverSeconds float64 `json:"failover_seconds"`
	// EventsLost counts created ConfigMaps the informer never saw.
	EventsLost int `json:"events_lost"`
	// Duplicates counts logical creates that produced more than one object.
	Duplicates int `json:"duplicates"`
	// FailedRequests is FailedGets + FailedWrites.
	FailedRequests int `json:"failed_requests"`
	FailedGets     int `json:"failed_gets"`
	FailedWrites   int `json:"failed_writes"`
	Gets           int `json:"gets"`
	Writes         int `json:"writes"`
	Relists        int `json:"relists"`
	// Figures holds the scenario's other measurements, in seconds unless
	// the name says otherwise.
	Figures         map[string]float64 `json:"figures,omitempty"`
	DurationSeconds float64            `json:"duration_seconds"`
	Error           string             `json:"error,omitempty"`
}

var (
	summaryMu sync.Mutex
	summary   []*row
)

func addRow(r *row) {
	summaryMu.Lock()
	summary = append(summary, r)
	summaryMu.Unlock()
}

// writeSummary writes _output/e2e/summary.json when any scenario ran.
func writeSummary() error {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if len(summary) == 0 {
		return nil
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "_output", "e2e")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(summary, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("e2e: wrote %s (%d scenarios)\n", path, len(summary))
	return nil
}
