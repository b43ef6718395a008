package main_test

import (
	"testing"

	main "github.com/apifailover/apifailover/cmd/localproxy"
)

// --gomaxprocs: 0 (the default) keeps Go's choice; a value applies unless
// the GOMAXPROCS environment variable is set and the flag was not given.
func TestApplyGOMAXPROCS(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		set  bool
		env  string
		want int
	}{
		{"default: Go's choice", 0, false, "", 7},
		{"unset, GOMAXPROCS set", 1, false, "3", 7},
		{"flag", 2, true, "", 2},
		{"flag over GOMAXPROCS", 2, true, "3", 2},
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
