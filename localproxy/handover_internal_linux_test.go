package localproxy

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListeningInodes(t *testing.T) {
	const table = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1D15 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1D15 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1D15 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 100 0 0 10 0
   3: 00000000:1D15 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 100 0 0 10 0
   4: 0100007F:1D16 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
`
	const table6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1D15 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 666 1 0000000000000000 100 0 0 10 0
`
	v4 := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7445}
	got, err := listeningInodes(strings.NewReader(table), v4)
	require.NoError(t, err)
	assert.Equal(t, []uint64{111, 222}, got, "listening on 127.0.0.1:7445 only: not established, not 0.0.0.0, not 7446")
	got, err = listeningInodes(strings.NewReader(table6), &net.TCPAddr{IP: net.IPv6loopback, Port: 7445})
	require.NoError(t, err)
	assert.Equal(t, []uint64{666}, got)

	for name, bad := range map[string]string{
		"no port":      "0100007F 00000000:0000 0A",
		"bad port":     "0100007F:XYZ 00000000:0000 0A",
		"odd address":  "0100007:1D15 00000000:0000 0A",
		"bad hex":      "0100007G:1D15 00000000:0000 0A",
		"short v6":     "0000000000000000000000000100000:1D15 00000000:0000 0A",
		"inode not nr": "0100007F:1D15 00000000:0000 0A",
	} {
		t.Run(name, func(t *testing.T) {
			inode := "777"
			if name == "inode not nr" {
				inode = "x7"
			}
			line := "header\n 0: " + bad + " 00000000:00000000 00:00000000 00000000 0 0 " + inode + " 1\n"
			_, err := listeningInodes(strings.NewReader(line), v4)
			assert.Error(t, err)
		})
	}
}

// TestSteerToNewest: two sockets in one SO_REUSEPORT group; otherListeners
// sees the other, and once the older one steers, every new connection is
// queued on the newer one and none on the older.
func TestSteerToNewest(t *testing.T) {
	ctx := context.Background()
	a, err := listenReusePort(ctx, "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer a.Close()
	assert.Equal(t, 0, otherListeners(a), "alone")
	b, err := listenReusePort(ctx, "tcp", a.Addr().String())
	require.NoError(t, err, "a second socket binds the same address")
	defer b.Close()
	assert.Equal(t, 1, otherListeners(a))
	assert.Equal(t, 1, otherListeners(b))

	require.NoError(t, steerToNewest(a, 2))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 20 {
		c, err := net.Dial("tcp", a.Addr().String())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	// The handshake is complete when Dial returns: the connections are
	// queued.
	assert.Equal(t, 0, acceptQueued(a), "the older socket gets nothing")
	assert.Equal(t, 20, acceptQueued(b), "the newer socket gets all")

	// A third socket that joins clears the steering: connections spread
	// by hash again, so the newest, not yet ready, does not get them all.
	c, err := listenReusePort(ctx, "tcp", a.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	for range 40 {
		cc, err := net.Dial("tcp", a.Addr().String())
		require.NoError(t, err)
		conns = append(conns, cc)
	}
	assert.Positive(t, acceptQueued(a), "hashing again reaches the oldest")
}
