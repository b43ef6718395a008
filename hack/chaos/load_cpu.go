package chaos

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// The soak's CPU: this process (the clients, the attack), the localproxy
// processes, and every other process under it (etcd, the apiservers,
// kubectl), from /proc, over the load; and the whole machine's busy share
// (/proc/stat: other work on the machine counts there too).

// clockTick is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTick = 100

// cpuSample is a moment's CPU times, in seconds.
type cpuSample struct {
	at time.Time
	// self: this process's user+system; reaped: its waited-for children's
	// (apiservers killed and restarted, kubectl runs) but localproxy's;
	// others: the live descendants' (etcd, the apiservers) but
	// localproxy's; proxy: the localproxy processes', live or exited.
	self, reaped, others, proxy float64
	// busy and total: the machine's, from /proc/stat.
	busy, total float64
}

// CPUReport is the CPU the soak used while its load ran.
type CPUReport struct {
	Seconds float64 `json:"wall_s"`
	// Client is this process (clients, attack), in cores (CPU seconds
	// per second); LocalProxy its instances (built with the race
	// detector, logging every connection); Bed is etcd, the apiservers
	// and kubectl; Machine is the whole machine's busy share times its
	// cores.
	Client     float64 `json:"client_cores"`
	LocalProxy float64 `json:"localproxy_cores"`
	Bed        float64 `json:"bed_cores"`
	Machine    float64 `json:"machine_cores"`
	Cores      int     `json:"cores"`
}

// takeCPU samples the CPU times; lp (nil: none) tells the localproxy
// processes apart.
func takeCPU(lp *proxyHandle) cpuSample {
	s := cpuSample{at: time.Now()}
	self := os.Getpid()
	proxies := map[int]bool{}
	if lp != nil {
		var exited float64
		proxies, exited = lp.cpu()
		s.proxy, s.reaped = exited, -exited
	}
	if f := statFields(self); f != nil {
		s.self = ticks(f, 14) + ticks(f, 15)    // utime, stime
		s.reaped += ticks(f, 16) + ticks(f, 17) // cutime, cstime
	}
	parent := map[int]int{}
	fields := map[int][]string{}
	es, _ := os.ReadDir("/proc")
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(pid); f != nil {
			ppid, _ := strconv.Atoi(f[1])
			parent[pid], fields[pid] = ppid, f
		}
	}
	for pid, f := range fields {
		if proxies[pid] {
			s.proxy += ticks(f, 14) + ticks(f, 15)
			continue
		}
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == self {
				s.others += ticks(f, 14) + ticks(f, 15)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		for i, v := range strings.Fields(line)[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			s.total += n / clockTick
			if i != 3 && i != 4 { // idle, iowait
				s.busy += n / clockTick
			}
		}
	}
	return s
}

// statFields returns /proc/pid/stat's fields after the command (field 3,
// the state, first), nil if unreadable.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// ticks returns field n of stat(5) (1-based, counting pid and comm) in
// seconds, from the fields statFields returns.
func ticks(f []string, n int) float64 {
	i := n - 3
	if i < 0 || i >= len(f) {
		return 0
	}
	v, _ := strconv.ParseFloat(f[i], 64)
	return v / clockTick
}

// cpuBetween is the CPU used from a to b. Descendants that exited and
// were not reaped by this process are missed (none should be).
func cpuBetween(a, b cpuSample, cores int) CPUReport {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return CPUReport{}
	}
	r := CPUReport{Seconds: wall, Cores: cores}
	r.Client = (b.self - a.self) / wall
	r.LocalProxy = (b.proxy - a.proxy) / wall
	r.Bed = (b.reaped - a.reaped + b.others - a.others) / wall
	if dt := b.total - a.total; dt > 0 {
		r.Machine = (b.busy - a.busy) / dt * float64(cores)
	}
	return r
}
