package transport

// CheckTLSFiles checks f's CA and client certificate files now, as its
// timer does every Options.TLSReloadInterval.
func CheckTLSFiles(f *Failover) { f.tls.CheckNow() }
