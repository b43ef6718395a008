package chaos

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/apifailover/apifailover/hack/workload"
)

func TestCompareCaches(t *testing.T) {
	k := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	truth := snapshot{k("a"): "1", k("b"): "2", k("c"): "3"}
	for _, tc := range []struct {
		name                  string
		cache                 snapshot
		lost, phantoms, stale int
	}{
		{"equal", snapshot{k("a"): "1", k("b"): "2", k("c"): "3"}, 0, 0, 0},
		{"lost", snapshot{k("a"): "1", k("b"): "2"}, 1, 0, 0},
		{"deleted object still cached", snapshot{k("a"): "1", k("b"): "2", k("c"): "3", k("d"): "4"}, 0, 1, 0},
		{"update missed", snapshot{k("a"): "1", k("b"): "1", k("c"): "3"}, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, p, s := compare(tc.cache, truth)
			if l != tc.lost || p != tc.phantoms || s != tc.stale {
				t.Errorf("compare = %d lost, %d phantoms, %d stale; want %d, %d, %d", l, p, s, tc.lost, tc.phantoms, tc.stale)
			}
		})
	}
}

// checkWorkers fails on every way the apiservers' truth can contradict
// what the workers were told, and accepts what a failed request leaves
// open.
func TestCheckWorkers(t *testing.T) {
	cm := func(name, op, state string) corev1.ConfigMap {
		return corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{workerLabel: "w", workload.OpLabel: op}},
			Data:       map[string]string{"op": op, "state": state},
		}
	}
	counter := func(n string) corev1.ConfigMap {
		return corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: counterName}, Data: map[string]string{"count": n}}
	}
	newSet := func() *workerSet {
		w := &worker{id: "w", path: pathTransport, ns: "ns", st: workerStats{
			objects: map[string]*known{
				"kept":    {op: "w-1", state: objKept, updated: true},
				"gone":    {op: "w-2", state: objDeleted},
				"unsure":  {op: "w-3", state: objDeleteUnsure},
				"stopped": {op: "w-4", state: objInterrupted},
			},
			unsureCreates: map[string]bool{"w-5": true},
			counterAcked:  3, counterUnsure: 1,
			gets: []workload.Request{{Start: time.Now(), End: time.Now()}},
		}}
		return &workerSet{workers: []*worker{w}}
	}
	good := []corev1.ConfigMap{cm("kept", "w-1", "updated"), cm("unsure", "w-3", "updated"), cm("landed", "w-5", "created"), counter("4")}
	for _, tc := range []struct {
		name  string
		items []corev1.ConfigMap
		want  string // a violation containing it; "" for none
	}{
		{"consistent", good, ""},
		{"counter without the failed increment", append(good[:3:3], counter("3")), ""},
		{"kept object missing", []corev1.ConfigMap{cm("unsure", "w-3", "updated"), counter("3")}, "missing"},
		{"update lost", []corev1.ConfigMap{cm("kept", "w-1", "created"), counter("3")}, "updates lost"},
		{"deleted object back", append(good[:3:3], cm("gone", "w-2", "updated"), counter("3")), "after their delete"},
		{"create made twice", append(good[:3:3], cm("twin", "w-1", "created"), counter("3")), "made twice"},
		{"object of nobody", append(good[:3:3], cm("stray", "x-9", "created"), counter("3")), "accounts for"},
		{"increment lost", append(good[:3:3], counter("2")), "counters hold 2"},
		{"increment made twice", append(good[:3:3], counter("5")), "counters hold 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, v := checkWorkers(newSet(), tc.items)
			got := strings.Join(v, "\n")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("violations %q, want one containing %q", got, tc.want)
			}
			if rep.Creates != 4 || rep.Requests[pathTransport] != 1 {
				t.Errorf("report %+v: want 4 creates and 1 request", rep)
			}
		})
	}
}

// The churn's slices are what the issue lists, and the pause covers the
// all-down phase.
func TestChurnSlices(t *testing.T) {
	c := &churn{real: map[string]bool{"10.250.0.1:6443": true, "10.250.0.2:6443": true}}
	for _, kind := range churnKinds {
		s := c.slice(kind, 1)
		if s.Labels["kubernetes.io/service-name"] != "kubernetes" || !strings.HasPrefix(s.Name, churnPrefix) {
			t.Errorf("%s: slice %s labelled %v", kind, s.Name, s.Labels)
		}
		n := 0
		for _, ep := range s.Endpoints {
			n += len(ep.Addresses)
		}
		switch kind {
		case "empty":
			if n != 0 {
				t.Errorf("empty slice has %d addresses", n)
			}
		case "many":
			if n != manySliceAddrs {
				t.Errorf("many: %d addresses, want %d", n, manySliceAddrs)
			}
		}
	}
	began := time.Now()
	c.pauses = [][2]time.Time{{began.Add(50 * time.Second), began.Add(80 * time.Second)}}
	for at, want := range map[time.Duration]bool{49 * time.Second: false, 50 * time.Second: true, 79 * time.Second: true, 80 * time.Second: false} {
		if got := c.paused(began.Add(at)); got != want {
			t.Errorf("paused at %v = %v, want %v", at, got, want)
		}
	}
}

// Every address a churned slice holds is made up, the apiservers' are not.
func TestMadeUp(t *testing.T) {
	c := &churn{real: map[string]bool{"10.250.0.1:6443": true}}
	for _, kind := range churnKinds {
		for _, ep := range c.slice(kind, 1).Endpoints {
			for _, a := range ep.Addresses {
				addr := net.JoinHostPort(a, "6443")
				if got, want := madeUp(addr), a != "10.250.0.1"; got != want {
					t.Errorf("%s: madeUp(%s) = %v, want %v", kind, addr, got, want)
				}
			}
		}
	}
	for _, addr := range []string{"10.250.0.4:6443", "control-plane.apifailover.test:6443", "[::1]:6443"} {
		if madeUp(addr) {
			t.Errorf("madeUp(%s) = true", addr)
		}
	}
}

func TestCPUFields(t *testing.T) {
	s := takeCPU(nil)
	if s.self <= 0 || s.total <= 0 || s.busy > s.total {
		t.Errorf("takeCPU() = %+v: want this process's CPU and the machine's", s)
	}
}

// The success target fails a soak of successEnforcedFrom or longer and is
// only reported by a shorter one; paths at or above it are not named.
func TestSuccessMisses(t *testing.T) {
	byPath := map[string]float64{pathTransport: 0.9997, pathLocalProxy: 0.9988, "kubectl": 1}
	misses, enforced := successMisses(byPath, 2*time.Minute)
	if len(misses) != 1 || !strings.HasPrefix(misses[0], "localproxy: success ratio 0.99880 below the target 0.999") || enforced {
		t.Errorf("2 minutes: misses %q, enforced %v; want localproxy's, reported only", misses, enforced)
	}
	if _, enforced := successMisses(byPath, successEnforcedFrom); !enforced {
		t.Error("a soak of successEnforcedFrom must fail on a miss")
	}
	if misses, _ := successMisses(map[string]float64{pathLocalProxy: minSuccess}, 10*time.Minute); len(misses) != 0 {
		t.Errorf("a path at the target is not a miss: %q", misses)
	}
}

// The apiservers may give a generated name again once its object is
// deleted: another worker's object under the name of one a worker
// deleted is that worker's, not the deleted one back.
func TestCheckWorkersNameGivenAgain(t *testing.T) {
	obj := func(worker, op string) corev1.ConfigMap {
		return corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w-abcde", Labels: map[string]string{workerLabel: worker, workload.OpLabel: op}},
			Data:       map[string]string{"op": op, "state": "updated"},
		}
	}
	set := func() *workerSet {
		a := &worker{id: "a", path: pathTransport, ns: "ns", st: workerStats{objects: map[string]*known{"w-abcde": {op: "a-1", state: objDeleted}}}}
		b := &worker{id: "b", path: pathTransport, ns: "ns", st: workerStats{objects: map[string]*known{"w-abcde": {op: "b-7", state: objKept, updated: true}}}}
		return &workerSet{workers: []*worker{a, b}}
	}
	_, v := checkWorkers(set(), []corev1.ConfigMap{obj("b", "b-7")})
	assert.Empty(t, v, "b's object under the name a's deleted one had")
	_, v = checkWorkers(set(), []corev1.ConfigMap{obj("a", "a-1")})
	assert.Contains(t, strings.Join(v, "\n"), "after their delete", "a's deleted object back")
}
