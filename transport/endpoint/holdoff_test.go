package endpoint_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestHoldoff(t *testing.T) {
	down := errors.New("connection refused")
	var h endpoint.Holdoff
	require.NoError(t, h.Err())

	h.Failed(h.Round(), down)
	err := h.Err()
	require.ErrorIs(t, err, down)
	assert.Contains(t, err.Error(), "next attempt in")

	h.OnEvent(upstream.Event{Kind: upstream.EventUp, Addr: "10.0.0.1:6443"})
	assert.NoError(t, h.Err(), "an endpoint coming up ends the holdoff")
	h.Failed(h.Round(), down)
	h.OnEvent(upstream.Event{Kind: upstream.EventDown, Addr: "10.0.0.1:6443"})
	assert.Error(t, h.Err(), "an endpoint going down does not")

	// A slow round that began before an endpoint came back (or before
	// another round succeeded) and failed after it starts no holdoff.
	h.End()
	slow := h.Round()
	h.OnEvent(upstream.Event{Kind: upstream.EventAdded, Addr: "10.0.0.2:6443"})
	h.Failed(slow, down)
	assert.NoError(t, h.Err(), "an out-of-date round held new dials off")

	short := endpoint.Holdoff{Duration: 20 * time.Millisecond}
	short.Failed(short.Round(), down)
	require.Error(t, short.Err())
	require.Eventually(t, func() bool { return short.Err() == nil }, 5*time.Second, 5*time.Millisecond)

	none := endpoint.Holdoff{Duration: -1}
	none.Failed(none.Round(), down)
	assert.NoError(t, none.Err())
}
