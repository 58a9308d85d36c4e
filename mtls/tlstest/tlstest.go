package tlstest

import (
	"context"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// NewCA returns a fresh built-in CA for trustDomain ("" means
// cluster.local), failing the test if it cannot be made.
func NewCA(t testing.TB, trustDomain string) *caclient.BuiltinCA {
	t.Helper()
	ca, err := caclient.NewBuiltinCA(trustDomain)
	if err != nil {
		t.Fatalf("tlstest: new CA: %v", err)
	}
	return ca
}

// Cert issues a certificate for id from ca, valid for caclient.DefaultTTL,
// through caclient.Client, failing the test on error.
func Cert(t testing.TB, ca *caclient.BuiltinCA, id identity.Identity) *mtls.WorkloadCert {
	t.Helper()
	c, err := caclient.New(caclient.Config{Signer: ca}).Fetch(context.Background(), id)
	if err != nil {
		t.Fatalf("tlstest: certificate for %s: %v", id, err)
	}
	return c
}
