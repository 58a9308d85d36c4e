package tlstest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// CA is a hand-shaped certificate authority: a root (NewRoot) or an
// intermediate (CA.Intermediate) with its private key.
type CA struct {
	// Cert is the CA's certificate.
	Cert *x509.Certificate
	// Key signs what the CA issues.
	Key crypto.Signer
	// Parent is the CA that signed this one; nil for a root.
	Parent *CA
}

// CAOptions shapes a CA certificate. The zero value is a P-256 CA valid from
// an hour ago for a day, allowed to sign certificates and CRLs.
type CAOptions struct {
	// CommonName defaults to "tlstest root" or "tlstest intermediate".
	CommonName string
	// Organization is the subject's O; Istio's CAs put the trust domain there.
	Organization []string
	// TrustDomains become spiffe://<td> URI SANs: the built-in CA signs for
	// each trust domain its root names.
	TrustDomains []string
	// KeyUsage defaults to CertSign|CRLSign.
	KeyUsage x509.KeyUsage
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
	// Key defaults to a fresh P-256 key (pass an RSA key where the type
	// matters).
	Key crypto.Signer
	// Modify, if set, has the last word on the template before signing,
	// for the odd certificate a test needs (a CA that is not a CA, say).
	Modify func(*x509.Certificate)
}

// NewRoot returns a self-signed root CA shaped by o.
func NewRoot(t testing.TB, o CAOptions) *CA {
	t.Helper()
	return newCA(t, nil, o, "tlstest root")
}

// Intermediate returns a CA signed by ca, shaped by o.
func (ca *CA) Intermediate(t testing.TB, o CAOptions) *CA {
	t.Helper()
	return newCA(t, ca, o, "tlstest intermediate")
}

func newCA(t testing.TB, parent *CA, o CAOptions, cn string) *CA {
	t.Helper()
	if o.CommonName != "" {
		cn = o.CommonName
	}
	if o.KeyUsage == 0 {
		o.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	}
	key := o.Key
	if key == nil {
		key = NewKey(t)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          Serial(t),
		Subject:               pkix.Name{CommonName: cn, Organization: o.Organization},
		NotBefore:             o.NotBefore,
		NotAfter:              o.NotAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              o.KeyUsage,
	}
	for _, td := range o.TrustDomains {
		tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: "spiffe", Host: td})
	}
	defaultValidity(tmpl)
	if o.Modify != nil {
		o.Modify(tmpl)
	}
	issuer, issuerKey := tmpl, key
	if parent != nil {
		issuer, issuerKey = parent.Cert, parent.Key
	}
	return &CA{Cert: sign(t, tmpl, issuer, key.Public(), issuerKey), Key: key, Parent: parent}
}

// FromBuiltin returns the root of a built-in CA as a CA, for tests that
// shape certificates or CRLs the mesh's own CA must be seen to have issued.
func FromBuiltin(t testing.TB, b *caclient.BuiltinCA) *CA {
	t.Helper()
	cb, _ := pem.Decode(b.RootPEM())
	kb, _ := pem.Decode(b.KeyPEM())
	if cb == nil || kb == nil {
		t.Fatal("tlstest: built-in CA PEM does not decode")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatalf("tlstest: built-in CA certificate: %v", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatalf("tlstest: built-in CA key: %v", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("tlstest: built-in CA key %T cannot sign", key)
	}
	return &CA{Cert: cert, Key: signer}
}

// Builtin loads ca (its certificate and key) as a caclient.BuiltinCA, so
// workload certificates from a root the test shaped go through the real
// client path.
func (ca *CA) Builtin(t testing.TB) *caclient.BuiltinCA {
	t.Helper()
	b, err := caclient.LoadBuiltinCA(ca.PEM(), ca.KeyPEM(t))
	if err != nil {
		t.Fatalf("tlstest: load built-in CA: %v", err)
	}
	return b
}

// Root returns the root at the top of ca's chain (ca itself for a root).
func (ca *CA) Root() *CA {
	for ca.Parent != nil {
		ca = ca.Parent
	}
	return ca
}

// PEM returns ca's certificate in PEM.
func (ca *CA) PEM() []byte { return CertPEM(ca.Cert.Raw) }

// KeyPEM returns ca's key as a PKCS #8 PEM block.
func (ca *CA) KeyPEM(t testing.TB) []byte {
	t.Helper()
	return KeyPEM(t, ca.Key)
}

// Pool returns a pool holding the root of ca's chain: what a peer trusting
// ca's mesh is configured with.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Root().Cert)
	return p
}

// CRL returns a DER CRL issued by ca revoking serials, valid from a minute
// ago for an hour. Its number is random, as the serials are.
func (ca *CA) CRL(t testing.TB, serials ...*big.Int) []byte {
	t.Helper()
	now := time.Now()
	tmpl := &x509.RevocationList{
		Number:     Serial(t),
		ThisUpdate: now.Add(-time.Minute),
		NextUpdate: now.Add(time.Hour),
	}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: now})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		t.Fatalf("tlstest: CRL: %v", err)
	}
	return der
}

// CRLPEM encodes DER CRLs as one PEM file, as CRL_PATH holds them.
func CRLPEM(ders ...[]byte) []byte {
	var b []byte
	for _, d := range ders {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: d})...)
	}
	return b
}

// CertPEM encodes a DER certificate in PEM.
func CertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// KeyPEM encodes key as a PKCS #8 PEM block.
func KeyPEM(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("tlstest: marshal key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// NewKey returns a fresh ECDSA P-256 key, the workload key type.
func NewKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlstest: key: %w", err)
	}
	return k, nil
}

// Serial returns a random positive 62-bit serial number.
func Serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := serial()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, fmt.Errorf("tlstest: serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// parseNames splits names into IP addresses and DNS names.
func parseNames(tmpl *x509.Certificate, names []string) {
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
}

func defaultValidity(tmpl *x509.Certificate) {
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
}

// sign creates the certificate and parses it back.
func sign(t testing.TB, tmpl, issuer *x509.Certificate, pub crypto.PublicKey, issuerKey crypto.Signer) *x509.Certificate {
	t.Helper()
	c, err := signCert(tmpl, issuer, pub, issuerKey)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func signCert(tmpl, issuer *x509.Certificate, pub crypto.PublicKey, issuerKey crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, pub, issuerKey)
	if err != nil {
		return nil, fmt.Errorf("tlstest: sign %q: %w", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlstest: parse %q: %w", tmpl.Subject.CommonName, err)
	}
	return c, nil
}
