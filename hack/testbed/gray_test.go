package testbed_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
)

// grayFaults checks the faults that leave an apiserver up but unwell:
// slow, lossy, bad serving certificates, and client certificates. Part of
// TestSmoke (one bed).
func grayFaults(t *testing.T, ctx context.Context, bed *testbed.Bed, s *testbed.APIServer) {
	heal := func(t *testing.T) {
		t.Cleanup(func() {
			if err := errors.Join(s.Fast(), s.Restore(), s.RestartGoodCert(ctx)); err != nil {
				t.Errorf("heal %s: %v", s.Name(), err)
			}
		})
	}

	t.Run("slow", func(t *testing.T) {
		heal(t)
		established := freshClient(t, bed, s, 5*time.Second)
		if err := call(ctx, established); err != nil {
			t.Fatal(err)
		}
		d := testbed.Slowness{Handshake: 300 * time.Millisecond, Response: time.Second}
		if err := s.Slow(d); err != nil {
			t.Fatal(err)
		}
		if !s.Slowed() {
			t.Fatal("Slowed() = false after Slow")
		}
		// A connection made before keeps its speed (DNAT only captures
		// new ones): it answers, whatever the time.
		began := time.Now()
		if err := call(ctx, established); err != nil {
			t.Fatalf("established connection: %v", err)
		}
		t.Logf("slow: request on a connection made before: %s", time.Since(began).Round(time.Millisecond))
		// A new connection is held: handshake + at least one response chunk.
		began = time.Now()
		if err := call(ctx, freshClient(t, bed, s, 10*time.Second)); err != nil {
			t.Fatalf("new connection through the shim: %v", err)
		}
		took := time.Since(began)
		t.Logf("fact: a GET on a new connection through Slow(%v, %v) took %s", d.Handshake, d.Response, took.Round(time.Millisecond))
		if took < d.Handshake+d.Response {
			t.Errorf("GET on a new connection took %s, want at least %s: the shim does not delay", took, d.Handshake+d.Response)
		}
		// With ResetExisting, connections made before are reset.
		if err := s.Fast(); err != nil {
			t.Fatal(err)
		}
		var nd net.Dialer
		raw, err := nd.DialContext(ctx, "tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		d.ResetExisting = true
		if err := s.Slow(d); err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = raw.Write([]byte("hello\n"))
		if err == nil {
			_, err = raw.Read(make([]byte, 1))
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connection made before Slow with ResetExisting: got %v, want a reset", err)
		}
		began = time.Now()
		if err := call(ctx, freshClient(t, bed, s, 10*time.Second)); err != nil {
			t.Fatalf("new connection through the shim after the reset: %v", err)
		}
		if took := time.Since(began); took < d.Handshake+d.Response {
			t.Errorf("GET on a new connection took %s, want at least %s", took, d.Handshake+d.Response)
		}
		// The apiservers' own connections are not redirected.
		if bed.LoopbackExempt() {
			if err := bed.WaitEndpoints(ctx, addrs(bed.APIServers()), 5*time.Second); err != nil {
				t.Errorf("slow server left the EndpointSlice: %v", err)
			}
		}
		if err := s.Fast(); err != nil {
			t.Fatal(err)
		}
		if err := s.Fast(); err != nil {
			t.Fatalf("second Fast: %v", err)
		}
		began = time.Now()
		expectWorks(t, ctx, bed, s)
		t.Logf("fast again: GET on a new connection took %s", time.Since(began).Round(time.Millisecond))
	})

	t.Run("lossy", func(t *testing.T) {
		heal(t)
		if err := s.Lossy(0.2); err != nil {
			t.Fatal(err)
		}
		if got := s.NetworkFault(); got != "lossy" {
			t.Fatalf("NetworkFault() = %q", got)
		}
		// TCP retransmits: requests succeed, some late. Not every one
		// within 15s: a SYN or its answer is lost 36% of the time, and
		// four losses in a row (1+2+4+8s of backoff) happen to about one
		// connection in 60, so 3 of 5 must succeed.
		var slowest time.Duration
		ok := 0
		for range 5 {
			began := time.Now()
			if err := call(ctx, freshClient(t, bed, s, 15*time.Second)); err != nil {
				t.Logf("GET through 20%% loss failed: %v", err)
				continue
			}
			ok++
			slowest = max(slowest, time.Since(began))
		}
		if ok < 3 {
			t.Fatalf("%d of 5 GETs through 20%% loss succeeded within 15s, want at least 3", ok)
		}
		t.Logf("fact: %d of 5 GETs on new connections through 20%% loss each way succeeded within 15s, slowest %s", ok, slowest.Round(time.Millisecond))
		if err := s.Lossy(1); err == nil {
			t.Error("Lossy(1) accepted")
		}
		if err := s.Restore(); err != nil {
			t.Fatal(err)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("serving certificate not yet valid", func(t *testing.T) {
		heal(t)
		began := time.Now()
		notBefore, err := s.RestartNotYetValid(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("restart with a certificate valid from %s took %s", notBefore.Format(time.TimeOnly), time.Since(began).Round(time.Millisecond))
		if got := s.CertFault(); got != testbed.CertNotYetValid {
			t.Fatalf("CertFault() = %q", got)
		}
		expectFailure(t, ctx, bed, s, "not yet valid", func(err error) bool {
			var inv x509.CertificateInvalidError
			return errors.As(err, &inv) && inv.Reason == x509.Expired
		})
		if err := pollUntil(ctx, time.Until(notBefore)+15*time.Second, func() bool {
			return call(ctx, freshClient(t, bed, s, 2*time.Second)) == nil
		}); err != nil {
			t.Fatalf("certificate never became valid: %v", err)
		}
		t.Logf("fact: the certificate verifies %s after its NotBefore, no restart", time.Since(notBefore).Round(time.Millisecond))
	})

	t.Run("serving certificate misnamed", func(t *testing.T) {
		heal(t)
		if err := s.RestartMisnamed(ctx); err != nil {
			t.Fatal(err)
		}
		expectFailure(t, ctx, bed, s, "misnamed", func(err error) bool {
			var host x509.HostnameError
			return errors.As(err, &host)
		})
		if err := s.RestartGoodCert(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.CertFault(); got != "" {
			t.Fatalf("CertFault() = %q after RestartGoodCert", got)
		}
		expectWorks(t, ctx, bed, s)
	})

	t.Run("client certificates", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "client.pem")
		client := func() kubernetes.Interface {
			cfg := bed.RESTConfig(testbed.Direct(s.Index()))
			cfg.BearerToken = ""
			cfg.CertFile, cfg.KeyFile = path, path
			cfg.Timeout = 5 * time.Second
			cfg.Dial = (&net.Dialer{}).DialContext // a transport of its own
			cfg.WarningHandler = rest.NoWarnings{}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return cs
		}
		good, err := bed.IssueClientCert("cert-admin", []string{"system:masters"}, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := good.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if err := call(ctx, client()); err != nil {
			t.Fatalf("GET with a valid client certificate: %v", err)
		}
		expired, err := bed.IssueClientCert("cert-admin", []string{"system:masters"}, time.Now().Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := expired.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if err := call(ctx, client()); !apierrors.IsUnauthorized(err) {
			t.Fatalf("GET with an expired client certificate: got %v, want 401", err)
		}
		if err := good.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if err := call(ctx, client()); err != nil {
			t.Fatalf("GET with the valid client certificate again: %v", err)
		}
		if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*")); len(matches) > 0 {
			t.Errorf("temporary files left: %s", strings.Join(matches, " "))
		}
	})
}
