//go:build !linux

package localproxy

// rawDirection reads with net.Conn.Read into a pooled buffer; elsewhere
// than on Linux there is no splice and no parking.
type rawDirection struct {
	d *direction
}

func (r *rawDirection) init(d *direction) { r.d = d }

// canPark: the poller is Linux only.
func (r *rawDirection) canPark() bool { return false }

// read reads src: n > 0 bytes in *bp (the caller puts bp back in
// copyBufs), or an error (io.EOF at the end).
func (r *rawDirection) read() (*[]byte, int, error) { return readBuffered(r.d.src) }

// bulk does nothing: the buffer copies everything.
func (r *rawDirection) bulk() (eof bool, err error) { return false, nil }

// write writes b to dst.
func (r *rawDirection) write(b []byte) (int, error) { return r.d.dst.Write(b) }
