package main_test

import (
	"testing"

	main "github.com/apifailover/apifailover/cmd/localproxy"
)

// --gomaxprocs: its default (2) applies unless the GOMAXPROCS environment
// variable is set; given, it wins over the variable; 0 keeps Go's choice.
func TestApplyGOMAXPROCS(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		set  bool
		env  string
		want int
	}{
		{"default", 2, false, "", 2},
		{"default, GOMAXPROCS set", 2, false, "3", 7},
		{"flag", 1, true, "", 1},
		{"flag over GOMAXPROCS", 1, true, "3", 1},
		{"zero: Go's choice", 0, true, "", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer main.SetGOMAXPROCS(main.SetGOMAXPROCS(7))
			if got := main.ApplyGOMAXPROCS(tc.n, tc.set, tc.env); got != tc.want {
				t.Errorf("ApplyGOMAXPROCS(%d, %v, %q) = %d, want %d", tc.n, tc.set, tc.env, got, tc.want)
			}
		})
	}
}
