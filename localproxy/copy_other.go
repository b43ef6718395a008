//go:build !linux

package localproxy

// rawCopier reads and writes with the net.Conn methods, through a pooled
// buffer; elsewhere than on Linux there is no splice and no parking.
type rawCopier struct {
	cp *copier
}

func (r *rawCopier) init(cp *copier) { r.cp = cp }
func (r *rawCopier) start()          {}
func (r *rawCopier) stop()           {}

// canPark: the poller is Linux only.
func (r *rawCopier) canPark() bool { return false }

// pump reads src once, for copy to write what it read.
func (r *rawCopier) pump() pumped { return readBuffered(r.cp.d.src()) }

// write writes b to dst.
func (r *rawCopier) write(b []byte) (int, error) { return r.cp.d.dst().Write(b) }

// bulk does nothing: the buffer copies everything.
func (r *rawCopier) bulk() (eof bool, err error) { return false, nil }
