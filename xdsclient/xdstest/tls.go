package xdstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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
// addresses; DefaultServerNames if none).
func NewTLS(t testing.TB, names ...string) *TLS {
	t.Helper()
	if len(names) == 0 {
		names = DefaultServerNames
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "xdstest root"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "istiod"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	rootFile := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(rootFile, rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return &TLS{
		ServerConfig: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		},
		RootPEM:  rootPEM,
		RootFile: rootFile,
	}
}
