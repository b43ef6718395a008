package localproxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apifailover/apifailover/transport/endpoint"
)

// DefaultNodeZoneInterval is how often the Node is read again, once read,
// to follow a change of its zone label.
const DefaultNodeZoneInterval = 10 * time.Minute

// Where the proxy's own zone came from, as /status and the zone_info
// metric say.
const (
	ZoneFromConfig = "config" // Config.Pool.Zone (--zone)
	ZoneFromNode   = "node"   // the Node's topology.kubernetes.io/zone label
	ZoneFromNone   = "none"   // no zone: endpoints are ranked without zones
)

// getNode reads a Node; a client-go NodeInterface's Get.
type getNode func(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)

// zoneLearner reads the topology.kubernetes.io/zone label of the Node the
// proxy runs on and hands it to apply: at start, then, once the label was
// read, every interval (a label rarely changes); while the Node cannot be
// read or has no label, with a backoff from 1s up to the interval. It
// never blocks serving: the proxy serves without a zone until apply runs.
type zoneLearner struct {
	get      getNode
	node     string
	interval time.Duration // <= 0: stop once the label was read
	apply    func(zone string)
	log      logr.Logger

	// mu guards the fields below.
	mu sync.Mutex
	// zone is the zone last read ("" before, or without a label);
	// problem why the last read learned none ("" after a label was read).
	zone, problem string
	read          bool // the Node was read at least once
}

func newZoneLearner(get getNode, node string, interval time.Duration, apply func(string), log logr.Logger) *zoneLearner {
	return &zoneLearner{get: get, node: node, interval: interval, apply: apply, log: log}
}

// run reads the Node until ctx is done.
func (l *zoneLearner) run(ctx context.Context) {
	b := endpoint.Backoff{Min: time.Second, Max: max(l.interval, time.Second)}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l.readOnce(ctx) {
			if l.interval <= 0 {
				return
			}
			b.Reset()
			t.Reset(endpoint.Jitter(l.interval))
			continue
		}
		if ctx.Err() != nil {
			return
		}
		t.Reset(b.Next())
	}
}

// readOnce reads the Node once and applies its zone label if it has one;
// it reports whether it did.
func (l *zoneLearner) readOnce(ctx context.Context) bool {
	readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// ResourceVersion "0": the API server's cache answers, not etcd.
	n, err := l.get(readCtx, l.node, metav1.GetOptions{ResourceVersion: "0"})
	if ctx.Err() != nil && err != nil {
		return false // stopping; a read that timed out is a problem, below
	}
	var problem string
	zone, labeled := "", false
	switch {
	case apierrors.IsForbidden(err):
		problem = fmt.Sprintf("reading node %s is forbidden (want RBAC get on nodes, as the chart's ClusterRole grants): %v", l.node, err)
	case apierrors.IsNotFound(err):
		problem = fmt.Sprintf("node %s not found (not registered yet, or --node-name is not this node's name)", l.node)
	case err != nil:
		problem = fmt.Sprintf("reading node %s: %v", l.node, err)
	default:
		zone, labeled = n.Labels[corev1.LabelTopologyZone]
		if labeled = labeled && zone != ""; !labeled {
			problem = fmt.Sprintf("node %s has no %s label", l.node, corev1.LabelTopologyZone)
		}
	}

	l.mu.Lock()
	prevZone, prevProblem, wasRead := l.zone, l.problem, l.read
	l.problem = problem
	if err == nil {
		l.zone, l.read = zone, true
	}
	l.mu.Unlock()

	switch {
	case err == nil && (zone != prevZone || !wasRead):
		if zone != prevZone {
			l.apply(zone)
		}
		if labeled {
			l.log.Info("zone learned from the node's label: API servers in it are preferred after local ones", "node", l.node, "label", corev1.LabelTopologyZone, "zone", zone, "previous", prevZone)
		} else {
			l.log.Info("no zone: "+problem+"; API servers are ranked without zones, and the label is read again", "node", l.node, "previous", prevZone)
		}
	case problem != "" && problem != prevProblem:
		l.log.Info("zone not learned: "+problem+"; retrying", "node", l.node, "zone", prevZone)
	case problem != "":
		l.log.V(2).Info("zone not learned: "+problem+"; retrying", "node", l.node, "zone", prevZone)
	}
	return labeled
}

// status returns the problem of the last read, "" if it learned the zone.
func (l *zoneLearner) status() string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.problem
}
