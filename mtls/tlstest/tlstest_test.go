package tlstest_test

import (
	"crypto/x509"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestCert(t *testing.T) {
	ca := tlstest.NewCA(t, "example.org")
	id := identity.New("example.org", "ns", "sa")
	c := tlstest.Cert(t, ca, id)
	if c.Identity != id {
		t.Fatalf("issued %v, want %v", c.Identity, id)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.RootPEM())
	if _, err := c.Certificate.Leaf.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Fatalf("certificate does not chain to the CA: %v", err)
	}
}
