//go:build !linux

package localproxy

import (
	"errors"
	"fmt"
	"runtime"
)

// CheckCongestionControl allows only SystemCongestionControl here:
// TCP_CONGESTION is Linux's.
func CheckCongestionControl(name string) error {
	if name == SystemCongestionControl {
		return nil
	}
	if err := checkCongestionName(name); err != nil {
		return err
	}
	return fmt.Errorf("%q: TCP_CONGESTION is not supported on %s: want %q", name, runtime.GOOS, SystemCongestionControl)
}

func setCongestionFD(int, string) error { return errors.ErrUnsupported }

const defaultLoopbackCongestionControl = SystemCongestionControl
