package endpoint_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/apifailover/apifailover/internal/leakcheck"
)

// TestMain fails the package's tests if a goroutine they started is still
// running, or a descriptor they opened still open, once they are done.
// Except client-go's own certificate rotation for a rest.Config with
// CertFile and KeyFile (Failover.HTTPClient's fallback transport has
// one): it runs until the garbage collector frees that transport.
func TestMain(m *testing.M) {
	leakcheck.Main(m,
		goleak.IgnoreAnyFunction("k8s.io/client-go/transport.(*dynamicClientCert).run"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/transport.(*dynamicClientCert).processNextWorkItem"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*delayingType[...]).waitingLoop"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.PollImmediateUntil"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.PollImmediateUntilWithContext.poller.func1.1"),
	)
}
