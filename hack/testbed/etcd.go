package testbed

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// etcd is the single-member etcd every apiserver stores into.
type etcd struct {
	proc      *process // the running process; replaced by a restart
	clientURL string
	peerURL   string
	path, dir string // the binary, and the bed's directory (data under etcd/)
}

// freePort returns a currently unused TCP port on 127.0.0.1. Inside the
// private network namespace nothing else races for it.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd launches etcd on 127.0.0.1 with random ports and its data
// under dir/etcd, and waits until /health reports true.
func startEtcd(ctx context.Context, path, dir string, timeout time.Duration) (*etcd, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	e := &etcd{
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", clientPort),
		peerURL:   fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		path:      path,
		dir:       dir,
	}
	if e.proc, err = e.launch(ctx, timeout); err != nil {
		return nil, err
	}
	return e, nil
}

// launch starts an etcd process on e's URLs and data, and waits until
// /health reports true. Started again after an exit, etcd keeps its data
// (the initial-cluster flags apply to a new data directory only).
func (e *etcd) launch(ctx context.Context, timeout time.Duration) (*process, error) {
	args := []string{
		"--name=testbed",
		"--data-dir=" + filepath.Join(e.dir, "etcd"),
		"--listen-client-urls=" + e.clientURL,
		"--advertise-client-urls=" + e.clientURL,
		"--listen-peer-urls=" + e.peerURL,
		"--initial-advertise-peer-urls=" + e.peerURL,
		"--initial-cluster=testbed=" + e.peerURL,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-outputs=stderr",
		"--log-level=warn",
	}
	proc, err := startProcess("etcd", filepath.Join(e.dir, "etcd.log"), e.path, args, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	err = poll(ctx, timeout, "etcd at "+e.clientURL+" not healthy", func(ctx context.Context) (bool, error) {
		if done, _ := proc.exited(); done {
			return false, stopPolling(proc.exitedError())
		}
		return etcdHealthy(ctx, client, e.clientURL)
	})
	if err != nil {
		_ = proc.kill()
		if done, _ := proc.exited(); done && !strings.Contains(err.Error(), "last lines") {
			err = fmt.Errorf("%w; last lines of %s:\n%s", err, proc.logPath, proc.tail())
		}
		return nil, err
	}
	return proc, nil
}

func etcdHealthy(ctx context.Context, client *http.Client, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"true"`) {
		return false, fmt.Errorf("/health: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return true, nil
}
