//go:build !linux

package endpoint_test

import "time"

// cpuTime is zero: not measured on this system.
func cpuTime() time.Duration { return 0 }
