package main_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/localproxy"
)

// Fail-back is on by default; --failback-settle and --failback-rate (or
// their variables) set it, 0 in either turns it off (a negative Config
// field), and a bad value names its flag or variable and what is allowed.
func TestFailbackFlags(t *testing.T) {
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp", "--enable-discovery=false"}
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		settle time.Duration
		rate   float64
	}{
		{"defaults", ok, nil, localproxy.DefaultFailbackSettle, localproxy.DefaultFailbackRate},
		{"flags", append(ok, "--failback-settle=5s", "--failback-rate=0.5"), nil, 5 * time.Second, 0.5},
		{"variables", ok, []string{"LOCALPROXY_FAILBACK_SETTLE", "1m", "LOCALPROXY_FAILBACK_RATE", "10"}, time.Minute, 10},
		{"settle 0: off", append(ok, "--failback-settle=0"), nil, -1, localproxy.DefaultFailbackRate},
		{"rate 0: off", ok, []string{"LOCALPROXY_FAILBACK_RATE", "0"}, localproxy.DefaultFailbackSettle, -1},
		{"one an hour", append(ok, "--failback-rate=0.00028"), nil, localproxy.DefaultFailbackSettle, 0.00028},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := main.ParseConfig(tc.args, env(tc.env...))
			require.NoError(t, err)
			assert.Equal(t, tc.settle, cfg.FailbackSettle)
			assert.Equal(t, tc.rate, cfg.FailbackRate)
		})
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"negative settle", append(ok, "--failback-settle=-1s"), nil, "localproxy: invalid --failback-settle=-1s: want 0 (fail-back off) or a positive duration"},
		{"negative rate", append(ok, "--failback-rate=-2"), nil, "localproxy: invalid --failback-rate=-2: want 0 (fail-back off) or connections per second from 1/3600 (one an hour, about 0.00028) to 1000, e.g. 2 or 0.5"},
		{"rate too high", append(ok, "--failback-rate=5000"), nil, "localproxy: invalid --failback-rate=5000: want 0 (fail-back off)"},
		{"rate below one an hour", append(ok, "--failback-rate=0.0002"), nil, "localproxy: invalid --failback-rate=0.0002: want 0 (fail-back off) or connections per second from 1/3600 (one an hour, about 0.00028) to 1000"},
		{"rate so low its gap overflows", append(ok, "--failback-rate=1e-10"), nil, "localproxy: invalid --failback-rate=1e-10: want 0 (fail-back off)"},
		{"rate subnormal from env", ok, []string{"LOCALPROXY_FAILBACK_RATE", "5e-324"}, "localproxy: invalid LOCALPROXY_FAILBACK_RATE=5e-324 (--failback-rate): want 0"},
		{"rate NaN from env", ok, []string{"LOCALPROXY_FAILBACK_RATE", "NaN"}, "localproxy: invalid LOCALPROXY_FAILBACK_RATE=NaN (--failback-rate): want 0"},
		{"rate not a number", append(ok, "--failback-rate=fast"), nil, `localproxy: invalid --failback-rate="fast": not a number; want a number, such as 2 or 0.5`},
		{"settle not a duration from env", ok, []string{"LOCALPROXY_FAILBACK_SETTLE", "30"}, `localproxy: invalid LOCALPROXY_FAILBACK_SETTLE="30" (--failback-settle): not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireRefused(t, tc.args, tc.env)
			var stderr bytes.Buffer
			assert.Equal(t, main.ExitUsage, main.Run(t.Context(), tc.args, env(tc.env...), io.Discard, &stderr))
			assert.Contains(t, stderr.String(), tc.want)
		})
	}
}
