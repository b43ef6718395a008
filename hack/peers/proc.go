package peers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a proxy process the benchmark started: its own process group,
// SIGKILLed if the benchmark dies, output in a log file.
type Proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid once done is closed
}

// StartProc starts path with args, logging to logPath, and waits until
// addr accepts TCP connections (or the process exits, or 10s pass).
func StartProc(ctx context.Context, name, logPath, addr string, path string, args ...string) (*Proc, error) {
	return StartProcWith(ctx, ProcOptions{}, name, logPath, addr, path, args...)
}

// ProcOptions are what StartProcWith does beyond StartProc.
type ProcOptions struct {
	// NewNetns starts the process in a network namespace of its own,
	// with no link but a loopback that is down: Started connects it.
	NewNetns bool
	// Started, if set, is called with the process's PID once it runs,
	// before the wait for its address; an error stops the process.
	Started func(pid int) error
}

// StartProcWith is StartProc with opts.
func StartProcWith(ctx context.Context, opts ProcOptions, name, logPath, addr string, path string, args ...string) (*Proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "=== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if opts.NewNetns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &Proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(lf, "=== %s exit: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
		lf.Close()
		close(p.done)
	}()
	if opts.Started != nil {
		if err := opts.Started(cmd.Process.Pid); err != nil {
			p.Stop()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited (%v) before listening on %s; log %s:\n%s", name, p.err, addr, logPath, Tail(logPath, 15))
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s does not listen on %s after 10s; log %s:\n%s", name, addr, logPath, Tail(logPath, 15))
		}
	}
}

func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Name is the name StartProc was given.
func (p *Proc) Name() string { return p.name }

// LogPath is the file of the process's output.
func (p *Proc) LogPath() string { return p.logPath }

// Exited reports whether the process ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop SIGKILLs the process group and waits for the process.
func (p *Proc) Stop() {
	if done, _ := p.Exited(); done {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// Tail returns the last n lines of a file, indented.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}
