package workload_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/workload"
)

func TestResults(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	fail := errors.New("connection lost")
	r := workload.Results{
		Gets: []workload.Request{
			{Start: at(0), End: at(10)},
			{Start: at(100), End: at(2100), Err: fail},
			{Start: at(900), End: at(1500)}, // sent before the fault at 1000
			{Start: at(1200), End: at(1800)},
			{Start: at(1100), End: at(1900)},
		},
		Writes: []workload.Request{
			{Seq: 1, Name: "cm-1", Start: at(0), End: at(5)},
			{Seq: 2, Name: "cm-2", Start: at(950), End: at(2000), Err: fail},
			{Seq: 3, Name: "cm-3", Start: at(1300), End: at(1400)},
			{Seq: 4, Name: "cm-4", Start: at(1500), End: at(1600)},
		},
		Seen: []workload.Sighting{
			{Name: "cm-1", Seq: 1, Time: at(6)},
			{Name: "cm-2", Seq: 2, Time: at(1000)}, // applied, answer lost
			{Name: "cm-3", Seq: 3, Time: at(1450)},
			{Name: "gen-x", Seq: 3, Time: at(1460)},
		},
		Lists: 3,
		Timeline: []workload.Event{
			{Time: at(0), Kind: workload.KindList},
			{Time: at(500), Kind: workload.KindList},
			{Time: at(1700), Kind: workload.KindList},
		},
	}
	fault := at(1000)
	if got := r.Relists(); got != 2 {
		t.Errorf("Relists() = %d, want 2", got)
	}
	if got := r.FailedGets(); got != 1 {
		t.Errorf("FailedGets() = %d, want 1", got)
	}
	if got := r.FailedWrites(); got != 1 {
		t.Errorf("FailedWrites() = %d, want 1", got)
	}
	if got, want := r.Created(), []string{"cm-1", "cm-3", "cm-4"}; !slices.Equal(got, want) {
		t.Errorf("Created() = %v, want %v", got, want)
	}
	if got, want := r.Lost(), []string{"cm-4"}; !slices.Equal(got, want) {
		t.Errorf("Lost() = %v, want %v", got, want)
	}
	if got, want := r.Duplicates(), []int{3}; !slices.Equal(got, want) {
		t.Errorf("Duplicates() = %v, want %v", got, want)
	}
	if got, ok := r.FirstGetOK(fault); !ok || !got.Equal(at(1800)) {
		t.Errorf("FirstGetOK = %v %v, want +1800ms (the GET sent before the fault does not count)", got.Sub(t0), ok)
	}
	if got, ok := r.FirstWriteOK(fault); !ok || !got.Equal(at(1400)) {
		t.Errorf("FirstWriteOK = %v %v, want +1400ms", got.Sub(t0), ok)
	}
	if got, ok := r.FirstSeenWrite(fault); !ok || !got.Equal(at(1450)) {
		t.Errorf("FirstSeenWrite = %v %v, want +1450ms", got.Sub(t0), ok)
	}
	if _, ok := r.FirstGetOK(at(5000)); ok {
		t.Error("FirstGetOK after the last GET reported one")
	}
	if got := r.ListsSince(fault); got != 1 {
		t.Errorf("ListsSince = %d, want 1", got)
	}
	// Successful GETs end at 10, 1500, 1800, 1900: from 1000 to 2500 the
	// longest blind stretch is 1900 -> 2500.
	if got, want := r.LongestGetGap(fault, at(2500)), 600*time.Millisecond; got != want {
		t.Errorf("LongestGetGap = %v, want %v", got, want)
	}
	if got, want := r.LongestGetGap(at(20), at(1600)), 1480*time.Millisecond; got != want {
		t.Errorf("LongestGetGap = %v, want %v", got, want)
	}
}

func TestStartValidates(t *testing.T) {
	if _, err := workload.Start(t.Context(), workload.Config{}); err == nil {
		t.Fatal("Start without a client succeeded")
	}
}
