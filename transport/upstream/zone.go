package upstream

// SetZone changes this client's topology zone (Config.Zone) while the pool
// runs, for a zone learned after the pool was created (e.g. from the
// node's topology.kubernetes.io/zone label): endpoints in the new zone
// rank after local ones and before the rest from now on. The candidate
// order is rebuilt at once; EventPreferred is delivered, on the calling
// goroutine, when the first endpoint changes. An empty zone ignores zones
// again.
//
// Config returns the zone set here too.
func (p *Pool) SetZone(zone string) {
	p.mu.Lock()
	if p.cfg.Zone != zone {
		p.cfg.Zone = zone
		p.dirty = true
		p.rebuildLocked()
	}
	p.mu.Unlock()
	p.flush()
}

// Zone returns this client's topology zone: Config.Zone, or what SetZone
// set since.
func (p *Pool) Zone() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Zone
}
