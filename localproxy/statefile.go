package localproxy

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/upstream"
)

// StateFileData is the content of the state file: the last-known-good
// endpoints of an origin, for a cold boot before discovery works.
type StateFileData struct {
	Origin string `json:"origin"`
	// CAFingerprints are "sha256:<hex>" of the cluster CA certificates
	// (Config.StateFileCA) the file is bound to.
	CAFingerprints []string  `json:"caFingerprints"`
	Endpoints      []string  `json:"endpoints"`
	Updated        time.Time `json:"updated"`
}

// StateFileTempPrefix begins the names of the temporary files the state
// file is written to, beside it, before they are renamed to it.
const StateFileTempPrefix = ".localproxy-state-"

// caFingerprints returns the "sha256:<hex>" fingerprints of the
// certificates in a PEM bundle, sorted; other blocks are skipped.
func caFingerprints(bundle []byte) []string {
	var out []string
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			continue
		}
		sum := sha256.Sum256(b.Bytes)
		out = append(out, "sha256:"+hex.EncodeToString(sum[:]))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// stateFile loads the state file into the pool at start and rewrites it
// when the set of healthy endpoints changes.
type stateFile struct {
	path   string
	origin string
	cas    []string // fingerprints the file is bound to
	pool   *upstream.Pool
	log    logr.Logger
	kick   chan struct{}
	last   []string // endpoints last written or loaded; used by run only
}

func newStateFile(path, origin string, cas []string, pool *upstream.Pool, log logr.Logger) *stateFile {
	return &stateFile{path: path, origin: origin, cas: cas, pool: pool, log: log.WithName("statefile"), kick: make(chan struct{}, 1)}
}

// load adds the state file's endpoints to the pool, unless the file is
// missing, unreadable, or belongs to another origin or another cluster
// CA.
func (s *stateFile) load() {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Info("ignoring unreadable state file", "path", s.path, "err", err.Error())
		return
	}
	var d StateFileData
	if err := json.Unmarshal(b, &d); err != nil {
		s.log.Info("ignoring malformed state file", "path", s.path, "err", err.Error())
		return
	}
	if d.Origin != s.origin {
		s.log.Info("ignoring state file of another origin", "path", s.path, "fileOrigin", d.Origin, "origin", s.origin)
		return
	}
	if len(d.CAFingerprints) == 0 {
		s.log.Info("ignoring state file bound to no cluster CA (written before the binding, or by hand)", "path", s.path)
		return
	}
	if !slices.ContainsFunc(d.CAFingerprints, func(f string) bool { return slices.Contains(s.cas, f) }) {
		s.log.Info("ignoring state file of another cluster: no CA certificate in common", "path", s.path,
			"fileCAs", d.CAFingerprints, "clusterCAs", s.cas)
		return
	}
	specs := make([]upstream.Spec, len(d.Endpoints))
	for i, e := range d.Endpoints {
		specs[i] = upstream.Spec{Addr: e}
	}
	if err := s.pool.Set(upstream.SourceStateFile, specs); err != nil {
		s.log.Info("ignoring invalid endpoints in the state file", "path", s.path, "err", err.Error())
	}
	s.last = d.Endpoints
	s.log.Info("loaded last-known-good endpoints", "path", s.path, "endpoints", d.Endpoints)
}

// run rewrites the file when the healthy endpoints change, until ctx is
// done.
func (s *stateFile) run(ctx context.Context) {
	unsubscribe := s.pool.Subscribe(func(ev upstream.Event) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	})
	defer unsubscribe()
	// The pool may have changed before the subscription: the probes run
	// from the start.
	s.save()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		s.save()
	}
}

// save writes the healthy endpoints, if there are any and they changed.
func (s *stateFile) save() {
	var eps []string
	for _, st := range s.pool.Status() {
		if st.State == upstream.StateHealthy {
			eps = append(eps, st.Addr)
		}
	}
	slices.Sort(eps)
	if len(eps) == 0 || slices.Equal(eps, s.last) {
		return
	}
	if err := writeStateFile(s.path, StateFileData{Origin: s.origin, CAFingerprints: s.cas, Endpoints: eps, Updated: time.Now().UTC()}); err != nil {
		s.log.Info("writing the state file failed", "path", s.path, "err", err.Error())
		return
	}
	s.last = eps
	s.log.V(1).Info("saved last-known-good endpoints", "path", s.path, "endpoints", eps)
}

// writeStateFile replaces the file atomically.
func writeStateFile(path string, d StateFileData) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), StateFileTempPrefix+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	// The content reaches the disk before the name does, and the rename
	// before this returns: after a crash the file is the old one or the
	// new one, whole.
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}
