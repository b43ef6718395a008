package localproxy

// ParkedDirections counts the copies of the open connections that wait
// for data in the poller, without a goroutine (see direction).
func (p *Proxy) ParkedDirections() int {
	n := 0
	for _, c := range p.snapshot() {
		c.mu.Lock()
		for i := range c.dirs {
			if c.dirs[i].state == dirParked {
				n++
			}
		}
		c.mu.Unlock()
	}
	return n
}
