package monotime

import (
	"strings"
	"testing"
	"time"
)

// An instant read back carries a monotonic reading (String shows it as
// "m=+…"), so that its distance to time.Now ignores the wall clock; it
// is the time it was taken from.
func TestTimeCarriesTheMonotonicClock(t *testing.T) {
	now := time.Now()
	back := Time(Of(now))
	if !strings.Contains(back.String(), " m=") {
		t.Fatalf("Time(Of(now)) = %s: no monotonic reading", back)
	}
	if !back.Equal(now) {
		t.Fatalf("Time(Of(now)) = %s, want %s", back, now)
	}
	if d := time.Since(Time(Of(now.Add(-time.Hour)))); d < time.Hour || d > time.Hour+time.Minute {
		t.Fatalf("an instant an hour ago is %v ago", d)
	}
}

// 0 is kept for "never": no instant is 0.
func TestNeverZero(t *testing.T) {
	if Of(base) != 1 {
		t.Fatalf("Of(base) = %d, want 1", Of(base))
	}
	if Now() == 0 {
		t.Fatal("Now() = 0")
	}
}
