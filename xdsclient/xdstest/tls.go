package xdstest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// DefaultServerNames are the names a kit server's certificate carries unless
// told otherwise: istiod's in-cluster name, localhost and 127.0.0.1.
var DefaultServerNames = []string{"istiod.istio-system.svc", "localhost", "127.0.0.1"}

// TLS is server-side TLS material for a fake control-plane server: a fresh
// CA and a server certificate it signed.
type TLS struct {
	// ServerConfig serves the certificate (TLS 1.3, ALPN h2 added by gRPC).
	ServerConfig *tls.Config
	// RootPEM is the CA certificate that verifies the server.
	RootPEM []byte
	// RootFile is RootPEM written to a file in the test's temp dir, for
	// XDS_ROOT_CA / CA_ROOT_CA.
	RootFile string
}

// NewTLS creates a CA and a server certificate for names (DNS names or IP
// addresses; DefaultServerNames if none), from the module's one test PKI.
func NewTLS(t testing.TB, names ...string) *TLS {
	t.Helper()
	if len(names) == 0 {
		names = DefaultServerNames
	}
	ca := tlstest.NewRoot(t, tlstest.CAOptions{CommonName: "xdstest root", KeyUsage: x509.KeyUsageCertSign})
	leaf := ca.Leaf(t, tlstest.LeafOptions{
		CommonName:  "istiod",
		Names:       names,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	rootPEM := ca.PEM()
	rootFile := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(rootFile, rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return &TLS{
		ServerConfig: tlstest.ServerConfig(leaf.TLS(), nil),
		RootPEM:      rootPEM,
		RootFile:     rootFile,
	}
}
