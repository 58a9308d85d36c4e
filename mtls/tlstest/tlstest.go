package tlstest

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
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

// WriteFiles writes c for a peer process into dir, each file in PEM: the
// key as PKCS #8 ("key.pem"), the chain as received without the roots, leaf
// first ("chain.pem"), and the root bundle ("roots.pem").
func WriteFiles(t testing.TB, dir string, c *mtls.WorkloadCert) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(c.Certificate.PrivateKey)
	if err != nil {
		t.Fatalf("tlstest: marshal key: %v", err)
	}
	files := map[string][]byte{
		"key.pem":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		"chain.pem": []byte(strings.Join(c.ChainPEM, "\n")),
		"roots.pem": c.RootsPEM,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatalf("tlstest: %v", err)
		}
	}
}
