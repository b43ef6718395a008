package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
)

const (
	// pathKubectl is the real kubectl through localproxy, as a kubelet's
	// or an operator's command line reaches the API on a node.
	pathKubectl = "kubectl"
	// kubectlEvery is the gap between two kubectl runs: each is a process
	// of its own (a new TCP and TLS connection through the proxy), which
	// costs this 2-core machine a tenth of a second of CPU.
	kubectlEvery = time.Second
	// kubectlTimeout is kubectl's --request-timeout, above the failover
	// budget, as the success target counts requests.
	kubectlTimeout = 10 * time.Second
)

// kubectlLoop runs `kubectl get configmaps` through localproxy as the
// bed's admin in namespace ns, once every kubectlEvery, until stop is
// closed; done then receives every run as a request (a failed run's error
// carries kubectl's stderr). kubectl's output goes to the soak's logs,
// which are scanned for secrets.
type kubectlLoop struct {
	stop chan struct{}
	done chan []workload.Request
}

func (r *run) startKubectl(ctx context.Context, ns string) (*kubectlLoop, error) {
	dir, err := os.MkdirTemp("", "chaos-kubectl-")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "localproxy.kubeconfig")
	if err := r.bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if _, err := r.bed.Kubectl(ctx, "create", "namespace", ns); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	l := &kubectlLoop{stop: make(chan struct{}), done: make(chan []workload.Request, 1)}
	go func() {
		defer os.RemoveAll(dir)
		var runs []workload.Request
		t := time.NewTicker(kubectlEvery)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				l.done <- runs
				return
			case <-ctx.Done():
				l.done <- runs
				return
			case <-t.C:
			}
			runs = append(runs, r.kubectlOnce(ctx, kubeconfig, ns))
		}
	}()
	return l, nil
}

// kubectlOnce runs kubectl once.
func (r *run) kubectlOnce(ctx context.Context, kubeconfig, ns string) workload.Request {
	ctx, cancel := context.WithTimeout(ctx, 2*kubectlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bed.KubectlPath(), "--kubeconfig="+kubeconfig,
		fmt.Sprintf("--request-timeout=%s", kubectlTimeout), "get", "configmaps", "-n", ns, "-o", "name")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	rq := workload.Request{Start: time.Now()}
	_, err := cmd.Output()
	rq.End = time.Now()
	if err != nil {
		rq.Err = fmt.Errorf("kubectl: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if stderr.Len() > 0 {
		r.logs.WriteString("kubectl " + stderr.String() + "\n")
	}
	return rq
}

// wait stops the loop and returns its runs.
func (l *kubectlLoop) wait() []workload.Request {
	close(l.stop)
	return <-l.done
}
