package main

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/localproxy"
)

// File descriptors localproxy needs: fdsPerConn per client connection
// (the client's socket and the upstream's; an idle connection holds
// nothing else), and fdsReserve besides: the splice pipes (two
// descriptors each, taken only while bulk data is spliced, by at most
// localproxy.MaxSplices copies at once; Go keeps finished ones for reuse
// until a garbage collection or two: fdsPipes), the health server's
// connections (one each, at most localproxy.HealthMaxConnections; it
// closes more at once) and fdsOther for listeners (a connection the
// health server is turning away included), the event loop (its epoll
// instance, the empty pipes it keeps, and the two duplicates a
// connection holds for a moment while it is handed to the loop, 16 in
// all), probes, discovery, the state file and the runtime.
const (
	fdsPerConn = 2
	fdsPipes   = 4 * localproxy.MaxSplices
	fdsOther   = 112
	fdsReserve = fdsPipes + localproxy.HealthMaxConnections + fdsOther
)

// fileLimit returns the process's file descriptor limit (RLIMIT_NOFILE;
// the Go runtime has already raised the soft limit to the hard one), or
// RLIM_INFINITY if it cannot be read.
func fileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return unix.RLIM_INFINITY
	}
	return rl.Cur
}

// maxConnsFor returns the most client connections that fit in limit.
func maxConnsFor(limit uint64) int {
	if limit == unix.RLIM_INFINITY || limit > 1<<40 {
		return 1 << 30
	}
	return int(max(0, (int64(limit)-fdsReserve)/fdsPerConn))
}

// fileLimitError says why maxConns client connections cannot fit in
// limit, nil if they do: past it, accept fails with EMFILE while the
// proxy believes it has room.
func fileLimitError(maxConns int, limit uint64) error {
	fit := maxConnsFor(limit)
	if maxConns <= fit {
		return nil
	}
	need := uint64(maxConns)*fdsPerConn + fdsReserve
	return fmt.Errorf("--max-connections=%d needs about %d file descriptors (%d per connection, %d besides) but the limit (RLIMIT_NOFILE) is %d: raise it (LimitNOFILE= in the systemd unit, ulimit -n) or set --max-connections to at most %d",
		maxConns, need, fdsPerConn, fdsReserve, limit, fit)
}
