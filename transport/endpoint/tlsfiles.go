package endpoint

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// DefaultTLSReloadInterval is how often CA and client certificate files are
// checked for change: by a Failover's timer, and by handshakes (probes,
// dials) at most this often.
const DefaultTLSReloadInterval = 10 * time.Second

// fileWatch re-reads a CA bundle or a client certificate pair from files
// when their content changes, keeping the last good value when a new read
// fails or does not parse (a rotation caught half-written, a key that does
// not match its certificate). Checks are rate-limited to one per interval
// unless forced; a change runs the subscribers, outside the lock, in the
// goroutine that saw it.
type fileWatch struct {
	what     string   // "CA" or "client certificate", for logs
	files    []string // the CA file, or the certificate and key files
	interval time.Duration
	log      logr.Logger
	// parse turns the files' contents into the value kept.
	parse func(contents [][]byte) (any, error)

	// mu guards the fields below. check holds it while it reads and parses
	// the files (small, and read at most once per interval), never while
	// it logs or runs the subscribers: they may call current and subscribe,
	// and may take other locks (the L4 proxy's resets the pool's
	// quarantines: Pool.mu, then pool events). Nothing else is locked
	// under mu.
	mu      sync.Mutex
	checked time.Time
	sum     [sha256.Size]byte // of the contents last parsed, good or bad
	value   any
	gen     uint64 // counts changes of value
	subs    map[int]func()
	nextSub int
}

func newFileWatch(what string, files []string, interval time.Duration, log logr.Logger, parse func([][]byte) (any, error)) (*fileWatch, error) {
	w := &fileWatch{what: what, files: files, interval: OrDefault(interval, DefaultTLSReloadInterval), log: log, parse: parse, subs: make(map[int]func())}
	contents, sum, err := w.read()
	if err == nil {
		w.value, err = parse(contents)
	}
	if err != nil {
		return nil, err
	}
	w.sum, w.checked = sum, time.Now()
	return w, nil
}

// newCAWatch watches a PEM CA bundle, as rest.Config.CAFile or
// --ca-file. An empty file or one without certificates is an error at
// start; later, it keeps the last good bundle.
func newCAWatch(file string, interval time.Duration, log logr.Logger) (*fileWatch, error) {
	return newFileWatch("CA", []string{file}, interval, log, func(c [][]byte) (any, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c[0]) {
			return nil, fmt.Errorf("CA file %s: want a PEM file with at least one certificate", file)
		}
		return pool, nil
	})
}

// newCertWatch watches a client certificate and its key (the same file
// for kubelet's kubelet-client-current.pem).
func newCertWatch(certFile, keyFile string, interval time.Duration, log logr.Logger) (*fileWatch, error) {
	return newFileWatch("client certificate", []string{certFile, keyFile}, interval, log, func(c [][]byte) (any, error) {
		cert, err := tls.X509KeyPair(c[0], c[1])
		if err != nil {
			return nil, fmt.Errorf("client certificate %s, key %s: %w", certFile, keyFile, err)
		}
		return &cert, nil
	})
}

func (w *fileWatch) read() ([][]byte, [sha256.Size]byte, error) {
	var contents [][]byte
	h := sha256.New()
	for _, f := range w.files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, [sha256.Size]byte{}, err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return nil, [sha256.Size]byte{}, fmt.Errorf("%s is empty", f)
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
		contents = append(contents, b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return contents, sum, nil
}

// check re-reads the files if force is set or the last check is an
// interval old. It reports whether the value changed.
func (w *fileWatch) check(force bool) bool {
	w.mu.Lock()
	now := time.Now()
	if !force && now.Sub(w.checked) < w.interval {
		w.mu.Unlock()
		return false
	}
	w.checked = now
	// Reading under the lock keeps concurrent checks from parsing the
	// same change twice; the files are small and checks rare.
	contents, sum, err := w.read()
	if err == nil && sum == w.sum {
		w.mu.Unlock()
		return false
	}
	var v any
	if err == nil {
		w.sum = sum // a bad content is reported once, not every check
		v, err = w.parse(contents)
	}
	if err != nil {
		w.mu.Unlock()
		w.log.Error(err, "reloading TLS files failed; keeping the last good one", "what", w.what, "files", w.files)
		return false
	}
	w.value = v
	w.gen++
	subs := make([]func(), 0, len(w.subs))
	for _, fn := range w.subs {
		subs = append(subs, fn)
	}
	w.mu.Unlock()
	w.log.Info("TLS files changed; using the new content", "what", w.what, "files", w.files)
	for _, fn := range subs {
		fn()
	}
	return true
}

// current returns the value and its generation, after a check if one is
// due.
func (w *fileWatch) current() (any, uint64) {
	w.check(false)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.value, w.gen
}

// subscribe runs fn after every change until the returned function is
// called.
func (w *fileWatch) subscribe(fn func()) (cancel func()) {
	w.mu.Lock()
	id := w.nextSub
	w.nextSub++
	w.subs[id] = fn
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.subs, id)
		w.mu.Unlock()
	}
}

// TLSFiles is a client TLS configuration whose CA bundle and/or client
// certificate come from files that may rotate. Either watch may be nil.
type TLSFiles struct {
	ca, cert *fileWatch
}

// NewTLSFiles watches the files of cfg that client-go would load once:
// CAFile unless CAData is set, and CertFile and KeyFile unless CertData or
// KeyData is set (as client-go's own rotation: a certificate given as
// data does not change). It returns nil when there is nothing to watch.
func NewTLSFiles(caFile string, caData []byte, certFile, keyFile string, certData, keyData []byte, interval time.Duration, log logr.Logger) (*TLSFiles, error) {
	var f TLSFiles
	var err error
	if caFile != "" && len(caData) == 0 {
		if f.ca, err = newCAWatch(caFile, interval, log); err != nil {
			return nil, err
		}
	}
	if certFile != "" && keyFile != "" && len(certData) == 0 && len(keyData) == 0 {
		if f.cert, err = newCertWatch(certFile, keyFile, interval, log); err != nil {
			return nil, err
		}
	}
	if f.ca == nil && f.cert == nil {
		return nil, nil
	}
	return &f, nil
}

// Apply makes base use the watched client certificate: every handshake
// asks for the current one. It returns base, changed in place.
func (f *TLSFiles) Apply(base *tls.Config) *tls.Config {
	if f == nil || f.cert == nil {
		return base
	}
	base.Certificates = nil
	base.GetClientCertificate = f.clientCertificate
	return base
}

// clientCertificate is tls.Config.GetClientCertificate.
func (f *TLSFiles) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	v, _ := f.cert.current()
	return v.(*tls.Certificate), nil
}

// Config returns base, or a clone of it that verifies servers with the
// current CA bundle. The verification itself is crypto/tls's own, so
// its errors are the usual ones (tls.CertificateVerificationError
// wrapping x509 errors) and VerifiedChains is set.
func (f *TLSFiles) Config(base *tls.Config) *tls.Config {
	if f == nil || f.ca == nil {
		return base
	}
	v, _ := f.ca.current()
	c := base.Clone()
	c.RootCAs = v.(*x509.CertPool)
	return c
}

// generation counts changes of either file set; it changes when sessions
// and connections made before no longer show the current files.
func (f *TLSFiles) generation() uint64 {
	if f == nil {
		return 0
	}
	var g uint64
	if f.ca != nil {
		_, n := f.ca.current()
		g += n
	}
	if f.cert != nil {
		_, n := f.cert.current()
		g += n
	}
	return g
}

// CheckNow checks both file sets now.
func (f *TLSFiles) CheckNow() {
	if f == nil {
		return
	}
	for _, w := range []*fileWatch{f.ca, f.cert} {
		if w != nil {
			w.check(true)
		}
	}
}

// HasCA reports whether f follows a CA file.
func (f *TLSFiles) HasCA() bool { return f != nil && f.ca != nil }

// OnCertChange runs fn after every change of the client certificate files,
// in the goroutine that saw it, until cancel is called. It does nothing
// without them.
func (f *TLSFiles) OnCertChange(fn func()) (cancel func()) {
	if f == nil || f.cert == nil {
		return func() {}
	}
	return f.cert.subscribe(fn)
}

// OnCAChange runs fn after every change of the CA file, in the goroutine
// that saw it, until cancel is called. It does nothing without one.
func (f *TLSFiles) OnCAChange(fn func()) (cancel func()) {
	if f == nil || f.ca == nil {
		return func() {}
	}
	return f.ca.subscribe(fn)
}
