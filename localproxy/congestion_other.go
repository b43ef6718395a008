//go:build !linux

package localproxy

import "errors"

// CheckCongestionControl allows only SystemCongestionControl here:
// TCP_CONGESTION is Linux's.
func CheckCongestionControl(name string) error {
	if name == SystemCongestionControl {
		return nil
	}
	if err := checkCongestionName(name); err != nil {
		return err
	}
	return errors.New("TCP_CONGESTION is not supported on this system: want " + SystemCongestionControl)
}

func setCongestionFD(int, string) error { return errors.ErrUnsupported }

const defaultLoopbackCongestionControl = SystemCongestionControl
