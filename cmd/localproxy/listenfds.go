package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// systemd socket activation (sd_listen_fds(3)): the service manager binds
// the sockets of a .socket unit, keeps them across restarts of the
// service, and passes them as file descriptors 3, 4, ... with LISTEN_FDS
// (how many), LISTEN_PID (the process they are for) and, optionally,
// LISTEN_FDNAMES (colon-separated names).
const (
	envListenFDs     = "LISTEN_FDS"
	envListenPID     = "LISTEN_PID"
	envListenFDNames = "LISTEN_FDNAMES"
	listenFDsStart   = 3
	// maxListenFDs bounds LISTEN_FDS: a proxy has a few listen addresses.
	maxListenFDs = 64
)

// passedFDs is what the LISTEN_* variables say: n descriptors from
// listenFDsStart, with their names if LISTEN_FDNAMES was set.
type passedFDs struct {
	n     int
	names []string
}

// parseListenFDs reads the LISTEN_* variables as sd_listen_fds does:
// without LISTEN_PID, or with the PID of another process, the variables
// are not for this process and are ignored (n is 0). A LISTEN_PID or
// LISTEN_FDS that is not a number, LISTEN_FDS out of range, or
// LISTEN_FDNAMES with another count of names is an error naming the
// variable.
func parseListenFDs(getenv func(string) string, pid int) (passedFDs, error) {
	ps := getenv(envListenPID)
	if ps == "" {
		return passedFDs{}, nil
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p <= 0 {
		return passedFDs{}, fmt.Errorf("invalid %s=%q: want the process ID the sockets are passed to, a positive whole number", envListenPID, ps)
	}
	if p != pid {
		return passedFDs{}, nil
	}
	fs := getenv(envListenFDs)
	n, err := strconv.Atoi(fs)
	if err != nil || n < 1 || n > maxListenFDs {
		return passedFDs{}, fmt.Errorf("invalid %s=%q: want the number of sockets passed from file descriptor %d on, 1 to %d", envListenFDs, fs, listenFDsStart, maxListenFDs)
	}
	out := passedFDs{n: n}
	if ns := getenv(envListenFDNames); ns != "" {
		out.names = strings.Split(ns, ":")
		if len(out.names) != n {
			return passedFDs{}, fmt.Errorf("invalid %s=%q: %d names, want one per socket (%s=%d), separated by colons", envListenFDNames, ns, len(out.names), envListenFDs, n)
		}
	}
	return out, nil
}

// takeListenEnv removes the LISTEN_* variables from the process
// environment, as sd_listen_fds(unset_environment=1) does, so that
// commands the proxy runs (--export-command) do not take them for theirs,
// and returns a getenv that still answers them.
func takeListenEnv(getenv func(string) string) func(string) string {
	kept := map[string]string{}
	for _, k := range []string{envListenFDs, envListenPID, envListenFDNames} {
		if v, ok := os.LookupEnv(k); ok {
			kept[k] = v
			os.Unsetenv(k)
		}
	}
	return func(k string) string {
		if v, ok := kept[k]; ok {
			return v
		}
		return getenv(k)
	}
}

// passedFile returns the file of passed descriptor fd, for
// inheritedListeners. A descriptor that is not open, or not a socket, is
// left alone (an *os.File would close it, on error or when collected):
// LISTEN_FDS then counts more than systemd passed, and the descriptor,
// if open, is one this process opened itself.
func passedFile(fd int, name string) (*os.File, error) {
	_, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	switch {
	case errors.Is(err, unix.EBADF):
		return nil, fmt.Errorf("is not open (%s counts more descriptors than were passed)", envListenFDs)
	case errors.Is(err, unix.ENOTSOCK):
		return nil, fmt.Errorf("is not a socket, and is left open (%s counts more descriptors than were passed, or another program's are in the way)", envListenFDs)
	case err != nil:
		return nil, fmt.Errorf("cannot be checked, and is left open: %v", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// listening reports whether f is a listening socket (SO_ACCEPTCONN):
// net.FileListener takes a connected socket too, on which every accept
// fails.
func listening(f *os.File) (bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN) }); err != nil {
		return false, err
	}
	return v == 1, serr
}

// inheritedListeners turns the passed descriptors into listeners, one per
// listen address and in any order, matched by the address each is bound
// to; file returns the descriptor's file (passedFile), or why the
// descriptor is left alone. A count, a descriptor that is no listening
// socket or an address that does not match the configured listen
// addresses is an error naming LISTEN_FDS and what is allowed.
func inheritedListeners(fds passedFDs, addrs []string, file func(fd int, name string) (*os.File, error)) (map[string]net.Listener, error) {
	byAddr := make(map[string]net.Listener, fds.n)
	closeAll := func() {
		for _, ln := range byAddr {
			ln.Close()
		}
	}
	// Every passed descriptor is taken (and closed, once dup'ed by
	// FileListener) even on error: none leaks into export commands.
	var errs []string
	for i := range fds.n {
		fd := listenFDsStart + i
		name := "LISTEN_FD_" + strconv.Itoa(fd)
		if i < len(fds.names) {
			name = fds.names[i]
		}
		f, err := file(fd, name)
		if err != nil {
			errs = append(errs, fmt.Sprintf("file descriptor %d (%s) %v", fd, name, err))
			continue
		}
		switch ok, err := listening(f); {
		case err != nil:
			f.Close()
			errs = append(errs, fmt.Sprintf("file descriptor %d (%s) is not a listening socket: %v", fd, name, err))
			continue
		case !ok:
			f.Close()
			errs = append(errs, fmt.Sprintf("file descriptor %d (%s) is a connected socket, not a listening one (a .socket unit with Accept=yes passes each connection instead of the listening socket)", fd, name))
			continue
		}
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Sprintf("file descriptor %d (%s) is not a listening socket: %v", fd, name, err))
			continue
		}
		a := ln.Addr().String()
		if _, dup := byAddr[a]; dup || !contains(addrs, a) {
			errs = append(errs, fmt.Sprintf("file descriptor %d (%s) is bound to %s", fd, name, a))
			ln.Close()
			continue
		}
		byAddr[a] = ln
	}
	if len(errs) == 0 && fds.n != len(addrs) {
		errs = append(errs, fmt.Sprintf("%d sockets passed", fds.n))
	}
	if len(errs) > 0 {
		closeAll()
		return nil, fmt.Errorf("invalid %s=%d: %s; want one listening TCP socket per listen address (%s), as the .socket unit's ListenStream= lines must be, with Accept=no",
			envListenFDs, fds.n, strings.Join(errs, "; "), strings.Join(addrs, ", "))
	}
	return byAddr, nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// listenInherited is a localproxy.Config.Listen that hands out the
// inherited listeners by address.
func listenInherited(byAddr map[string]net.Listener) func(ctx context.Context, network, address string) (net.Listener, error) {
	return func(_ context.Context, _, address string) (net.Listener, error) {
		ln, ok := byAddr[address]
		if !ok {
			return nil, fmt.Errorf("no socket passed by systemd (%s) for %s", envListenFDs, address)
		}
		delete(byAddr, address)
		return ln, nil
	}
}
