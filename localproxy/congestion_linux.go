package localproxy

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// CheckCongestionControl reports whether this process may set name as the
// TCP congestion control of its sockets (TCP_CONGESTION): the kernel has
// it (net.ipv4.tcp_available_congestion_control) and lets this process
// choose it (net.ipv4.tcp_allowed_congestion_control, or CAP_NET_ADMIN).
// It tries on a socket of its own, in this process's network namespace.
// SystemCongestionControl is always allowed. The error says what is wrong
// and what is allowed.
func CheckCongestionControl(name string) error {
	if name == SystemCongestionControl {
		return nil
	}
	if err := checkCongestionName(name); err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return fmt.Errorf("%q cannot be tried: no TCP socket: %w; %q needs none", name, err, SystemCongestionControl)
	}
	defer unix.Close(fd)
	err = setCongestionFD(fd, name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%q is not in this kernel: want one of net.ipv4.tcp_available_congestion_control (%s), or %q", name, congestionSysctl("available"), SystemCongestionControl)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%q is not allowed to this process without CAP_NET_ADMIN: want one of net.ipv4.tcp_allowed_congestion_control (%s), or %q", name, congestionSysctl("allowed"), SystemCongestionControl)
	}
	return fmt.Errorf("%q: %w; want one of net.ipv4.tcp_allowed_congestion_control (%s), or %q", name, err, congestionSysctl("allowed"), SystemCongestionControl)
}

// congestionSysctl returns net.ipv4.tcp_<which>_congestion_control, or
// "unknown" if it cannot be read.
func congestionSysctl(which string) string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_" + which + "_congestion_control")
	if s := strings.Join(strings.Fields(string(b)), " "); err == nil && s != "" {
		return s
	}
	return "unknown"
}

// setCongestionFD sets the TCP congestion control of the socket fd.
func setCongestionFD(fd int, name string) error {
	if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name); err != nil {
		return os.NewSyscallError("setsockopt TCP_CONGESTION", err)
	}
	return nil
}

const defaultLoopbackCongestionControl = "reno"
