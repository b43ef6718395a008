package localproxy_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// CheckCongestionControl accepts what the kernel lets this process set
// and "system"; anything else gets an error naming the value and what is
// allowed, and New refuses it.
func TestCheckCongestionControl(t *testing.T) {
	for _, ok := range []string{"reno", localproxy.SystemCongestionControl} {
		assert.NoError(t, localproxy.CheckCongestionControl(ok), ok)
	}
	for _, tc := range []struct{ name, want string }{
		{"", `"" is no congestion control name: want 1 to 15 lowercase letters, digits and '_', e.g. reno or cubic, or "system"`},
		{"BBR", `"BBR" is no congestion control name`},
		{"cubic ", `"cubic " is no congestion control name`},
		{"sixteen_chars_xx", `"sixteen_chars_xx" is no congestion control name`},
		{"nosuchcc", `"nosuchcc" is not in this kernel: want one of net.ipv4.tcp_available_congestion_control (`},
	} {
		err := localproxy.CheckCongestionControl(tc.name)
		require.Error(t, err, "%q", tc.name)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:6443"}, LoopbackCongestionControl: "nosuchcc"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `localproxy: LoopbackCongestionControl: "nosuchcc" is not in this kernel`)
}

// A node that keeps reno from unprivileged processes (left out of
// net.ipv4.tcp_allowed_congestion_control) does not stop the proxy from
// starting on the default: it keeps the system's congestion control on
// loopback, and says so. A value the caller chose is still refused.
func TestLoopbackCongestionDefaultFallsBack(t *testing.T) {
	notAllowed := errors.New(`"reno" is not allowed to this process without CAP_NET_ADMIN`)
	defer localproxy.SetCheckCongestionControl(func(name string) error {
		if name == localproxy.SystemCongestionControl {
			return nil
		}
		return notAllowed
	})()
	var logged bytes.Buffer
	log := funcr.New(func(prefix, args string) { logged.WriteString(args + "\n") }, funcr.Options{})
	p, err := localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:6443"}, Logger: log})
	require.NoError(t, err)
	assert.Equal(t, localproxy.SystemCongestionControl, p.LoopbackCongestionControl())
	assert.Contains(t, logged.String(), "keep the system's TCP congestion control")
	assert.Contains(t, logged.String(), "without CAP_NET_ADMIN")

	_, err = localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:6443"}, LoopbackCongestionControl: "reno"})
	require.ErrorIs(t, err, notAllowed)
}
