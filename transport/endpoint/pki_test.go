package endpoint_test

import (
	"testing"

	"github.com/apifailover/apifailover/internal/testpki"
)

// The test PKI (internal/testpki), under the names these tests use.
const originName = testpki.OriginName

type testPKI = testpki.PKI

func newPKI(t testing.TB) *testPKI { return testpki.New(t) }
