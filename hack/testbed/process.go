package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// logTailLines is how many log lines startup errors quote.
const logTailLines = 25

// process is one launched child: its own process group, SIGKILLed when this
// process dies (Pdeathsig), output appended to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	logFile *os.File

	// terminated is set once SIGTERM was sent; guarded by the owner's
	// mutex (APIServer.mu).
	terminated bool

	done chan struct{} // closed once the child has been reaped
	err  error         // result of Wait; valid after done is closed
}

// startProcess launches path with args, as cred if not nil. Output goes to
// logPath (appended, after a header line, so a restarted server keeps one
// log).
func startProcess(name, logPath, path string, args []string, cred *syscall.Credential) (*process, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	fmt.Fprintf(lf, "=== %s start %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, path, strings.Join(args, " "))

	cmd := exec.Command(path, args...)
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
		Credential: cred,
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, path, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, logFile: lf, done: make(chan struct{})}
	go p.reap()
	return p, nil
}

// reap waits for the child and records how it ended.
func (p *process) reap() {
	err := p.cmd.Wait()
	fmt.Fprintf(p.logFile, "=== %s exit %s: %v\n", time.Now().Format(time.RFC3339Nano), p.name, exitDescription(err))
	p.logFile.Close()
	p.err = err
	close(p.done)
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the child has been reaped, and how it ended.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// signal sends sig to the child's process group. Signalling a reaped child
// is a no-op.
func (p *process) signal(sig syscall.Signal) error {
	if done, _ := p.exited(); done {
		return nil
	}
	err := syscall.Kill(-p.pid(), sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	return nil
}

// wait blocks until the child has been reaped or ctx ends.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s (pid %d) still running: %w", p.name, p.pid(), context.Cause(ctx))
	}
}

// kill SIGKILLs the process group and waits for the child to be reaped.
// SIGKILL also ends a stopped (SIGSTOPped) process.
func (p *process) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	// A SIGKILLed child is reaped promptly; the timeout only guards
	// against an uninterruptible kernel sleep.
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("%s (pid %d) not reaped 30s after SIGKILL", p.name, p.pid())
	}
}

// tail returns the last lines of the log file, for error messages.
func (p *process) tail() string { return tailFile(p.logPath, logTailLines) }

// exitDescription renders a Wait error for logs and error messages.
func exitDescription(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// exitedError describes an unexpected exit, with the log tail.
func (p *process) exitedError() error {
	_, err := p.exited()
	return fmt.Errorf("%s exited (%s); last lines of %s:\n%s", p.name, exitDescription(err), p.logPath, p.tail())
}

// tailFile returns up to n last lines of path (at most the last 64 KiB).
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxTail = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxTail {
		if _, err := f.Seek(st.Size()-maxTail, io.SeekStart); err != nil {
			return fmt.Sprintf("(cannot read %s: %v)", path, err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + string(bytes.Join(lines, []byte("\n  ")))
}

// procGroup collects the processes a Bed started, so Close can end them all.
type procGroup struct {
	mu    sync.Mutex // guards procs
	procs []*process
}

func (g *procGroup) add(p *process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs = append(g.procs, p)
}

// killAll SIGKILLs every process (resuming none: SIGKILL ends stopped ones
// too) and waits for all of them.
func (g *procGroup) killAll() error {
	g.mu.Lock()
	procs := append([]*process(nil), g.procs...)
	g.mu.Unlock()
	var errs []error
	for _, p := range procs {
		if err := p.signal(syscall.SIGKILL); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range procs {
		if err := p.kill(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
