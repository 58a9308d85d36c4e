package caclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// ErrCSRRejected wraps every refusal of a CSR's content by BuiltinCA.Sign
// (bad signature, wrong names, foreign trust domain, impersonation
// mismatch), as opposed to failures of the CA itself.
var ErrCSRRejected = errors.New("caclient: csr rejected")

const (
	// rootValidity is the lifetime of a fresh built-in root.
	rootValidity = 10 * 365 * 24 * time.Hour
	// maxBackdate is how far before now a leaf becomes valid, to tolerate
	// peers whose clocks run behind ours.
	maxBackdate = time.Minute
)

// BuiltinCA is the embedded default CA, used when FAKE_CA=true or when a
// local config runs without CA_ADDRESS. Its root is either created at start
// or loaded from PEM (BUILTIN_CA_CERT / BUILTIN_CA_KEY files) so that peers
// outside the daemon can hold certificates the mesh trusts. It signs leaves
// directly with the root, so a chain is [leaf, root].
//
// A BuiltinCA is immutable and safe for concurrent use. It implements Signer.
type BuiltinCA struct {
	cert         *x509.Certificate
	key          crypto.Signer
	certPEM      []byte
	keyPEM       []byte
	trustDomains []string
}

var _ Signer = (*BuiltinCA)(nil)

// NewBuiltinCA creates a CA with a fresh self-signed ECDSA P-256 root, valid
// for 10 years, that signs for trustDomain ("" means cluster.local). The
// root names its trust domain both as a spiffe://<trust-domain> URI SAN and
// as its Organization (where Istio's own CA puts it), so that LoadBuiltinCA
// finds it again.
func NewBuiltinCA(trustDomain string) (*BuiltinCA, error) {
	if trustDomain == "" {
		trustDomain = identity.DefaultTrustDomain
	}
	if !validTrustDomain(trustDomain) {
		return nil, fmt.Errorf("caclient: invalid trust domain %q", trustDomain)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("caclient: generating CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ztunnel-go built-in CA", Organization: []string{trustDomain}},
		NotBefore:             now.Add(-maxBackdate),
		NotAfter:              now.Add(rootValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("caclient: creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("caclient: parsing the new CA certificate: %w", err)
	}
	return newCA(cert, key, []string{trustDomain})
}

// LoadBuiltinCA loads a CA from a PEM certificate (exactly one) and its PEM
// private key (PKCS#8, SEC 1 "EC PRIVATE KEY" or PKCS#1; ECDSA, RSA or
// Ed25519). The certificate must be a currently valid CA certificate allowed
// to sign certificates. The CA signs for the trust domains its certificate
// names: the hosts of its spiffe:// URI SANs or, if it has none, its
// Organization values (Istio's self-signed roots carry the trust domain there).
func LoadBuiltinCA(certPEM, keyPEM []byte) (*BuiltinCA, error) {
	cert, err := parseOneCert(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("caclient: CA certificate is not a CA certificate (basic constraints lack CA:TRUE)")
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("caclient: CA certificate's key usage does not allow signing certificates")
	}
	if now := time.Now(); now.After(cert.NotAfter) {
		return nil, fmt.Errorf("caclient: CA certificate expired at %s", cert.NotAfter.Format(time.RFC3339))
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("caclient: CA key does not match the CA certificate")
	}
	tds := certTrustDomains(cert)
	if len(tds) == 0 {
		return nil, errors.New("caclient: CA certificate names no trust domain (no spiffe://<trust-domain> URI SAN and no Organization)")
	}
	return newCA(cert, key, tds)
}

// newCA assembles a BuiltinCA and its PEM forms.
func newCA(cert *x509.Certificate, key crypto.Signer, tds []string) (*BuiltinCA, error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("caclient: encoding CA key: %w", err)
	}
	return &BuiltinCA{
		cert:         cert,
		key:          key,
		certPEM:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		keyPEM:       pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		trustDomains: tds,
	}, nil
}

// RootPEM returns the CA certificate in PEM, the mesh's trust anchor.
func (ca *BuiltinCA) RootPEM() []byte { return slices.Clone(ca.certPEM) }

// KeyPEM returns the CA's private key as PKCS#8 PEM, so that a test or a
// tool can write it next to RootPEM for LoadBuiltinCA.
func (ca *BuiltinCA) KeyPEM() []byte { return slices.Clone(ca.keyPEM) }

// TrustDomains returns the trust domains the CA signs for.
func (ca *BuiltinCA) TrustDomains() []string { return slices.Clone(ca.trustDomains) }

// Sign signs a PEM CSR and returns [leaf, root] in PEM. The CSR's signature
// must verify and it must carry exactly one SAN, a URI that is a SPIFFE
// identity in one of the CA's trust domains; if impersonate is non-zero it
// must be that identity. Refusals wrap ErrCSRRejected.
//
// The leaf is valid from shortly before now (a minute, or a tenth of ttl if
// that is less, so that short test lifetimes keep their refresh point ahead)
// until now+ttl, capped at the CA's own expiry; ttl <= 0 means DefaultTTL.
func (ca *BuiltinCA) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration, impersonate identity.Identity) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	csr, id, err := ca.checkCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	if !impersonate.IsZero() && impersonate != id {
		return nil, fmt.Errorf("%w: csr is for %s, impersonating %s", ErrCSRRejected, id, impersonate)
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	now := time.Now()
	// X.509 times hold whole seconds and the encoder truncates: round the expiry
	// up so a short-lived certificate is never shorter than asked, which would
	// put its half-life (the refresh point) up to a second early, even before now.
	notAfter := now.Add(ttl)
	if r := notAfter.Truncate(time.Second); r.Before(notAfter) {
		notAfter = r.Add(time.Second)
	}
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("caclient: CA certificate expired at %s", ca.cert.NotAfter.Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-min(maxBackdate, ttl/10)),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  csr.URIs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("caclient: signing certificate for %s: %w", id, err)
	}
	leaf := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return []string{string(leaf), string(ca.certPEM)}, nil
}

// checkCSR parses and vets a CSR, returning it and the identity it asks for.
func (ca *BuiltinCA) checkCSR(csrPEM []byte) (*x509.CertificateRequest, identity.Identity, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: no PEM block", ErrCSRRejected)
	}
	if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
		return nil, identity.Identity{}, fmt.Errorf("%w: PEM block %q is not a CERTIFICATE REQUEST", ErrCSRRejected, block.Type)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrCSRRejected, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: bad signature: %w", ErrCSRRejected, err)
	}
	if n := len(csr.DNSNames) + len(csr.EmailAddresses) + len(csr.IPAddresses); n > 0 {
		return nil, identity.Identity{}, fmt.Errorf("%w: %d DNS, email or IP SANs, want only a URI SAN", ErrCSRRejected, n)
	}
	if len(csr.URIs) != 1 {
		return nil, identity.Identity{}, fmt.Errorf("%w: %d URI SANs, want exactly one", ErrCSRRejected, len(csr.URIs))
	}
	s := csr.URIs[0].String()
	id, err := identity.Parse(s)
	if err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrCSRRejected, err)
	}
	// identity.Parse splits on '/' only; a CA must not sign URIs that carry
	// a query, a port or other characters SPIFFE does not allow.
	if !validTrustDomain(id.TrustDomain) || !validPathSegment(id.Namespace) || !validPathSegment(id.ServiceAccount) {
		return nil, identity.Identity{}, fmt.Errorf("%w: %q has characters spiffe ids do not allow", ErrCSRRejected, s)
	}
	if !slices.Contains(ca.trustDomains, id.TrustDomain) {
		return nil, identity.Identity{}, fmt.Errorf("%w: trust domain %q, this CA signs for %v", ErrCSRRejected, id.TrustDomain, ca.trustDomains)
	}
	return csr, id, nil
}

// validTrustDomain reports whether td uses only the characters the SPIFFE
// spec allows in a trust domain (lower-case letters, digits, '.', '-', '_').
func validTrustDomain(td string) bool {
	if td == "" {
		return false
	}
	for _, r := range td {
		if !isLowerAlnum(r) && !isPunct(r) {
			return false
		}
	}
	return true
}

// validPathSegment reports whether seg is a non-empty SPIFFE path segment
// (letters, digits, '.', '-', '_'; not "." or "..").
func validPathSegment(seg string) bool {
	if seg == "" || seg == "." || seg == ".." {
		return false
	}
	for _, r := range seg {
		if !isLowerAlnum(r) && !isUpper(r) && !isPunct(r) {
			return false
		}
	}
	return true
}

func isLowerAlnum(r rune) bool { return r >= 'a' && r <= 'z' || r >= '0' && r <= '9' }

func isPunct(r rune) bool { return r == '.' || r == '-' || r == '_' }

// certTrustDomains returns the trust domains a CA certificate names.
func certTrustDomains(c *x509.Certificate) []string {
	var tds []string
	for _, u := range c.URIs {
		if u.Scheme == "spiffe" && validTrustDomain(u.Host) && (u.Path == "" || u.Path == "/") && !slices.Contains(tds, u.Host) {
			tds = append(tds, u.Host)
		}
	}
	if len(tds) > 0 {
		return tds
	}
	for _, o := range c.Subject.Organization {
		o = strings.ToLower(o)
		if validTrustDomain(o) && !slices.Contains(tds, o) {
			tds = append(tds, o)
		}
	}
	return tds
}

// parseOneCert decodes a PEM input that must hold exactly one certificate.
func parseOneCert(certPEM []byte) (*x509.Certificate, error) {
	certs, err := mtls.ParseCertificatesPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("caclient: CA certificate: %w", err)
	}
	switch len(certs) {
	case 0:
		return nil, errors.New("caclient: CA certificate: no PEM CERTIFICATE block found")
	case 1:
		return certs[0], nil
	default:
		return nil, fmt.Errorf("caclient: CA certificate: %d certificates, want exactly one", len(certs))
	}
}

// parseKey decodes a PEM private key in any of the usual encodings.
func parseKey(keyPEM []byte) (crypto.Signer, error) {
	var block *pem.Block
	rest := keyPEM
	for {
		block, rest = pem.Decode(rest)
		// openssl ecparam -genkey writes the curve before the key.
		if block == nil || block.Type != "EC PARAMETERS" {
			break
		}
	}
	if block == nil {
		return nil, errors.New("caclient: CA key: no PEM block found")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("caclient: CA key: PEM block %q, want PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("caclient: CA key: %w", err)
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("caclient: CA key: unsupported key type %T, want ECDSA, RSA or Ed25519", key)
	}
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("caclient: serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func isUpper(r rune) bool { return r >= 'A' && r <= 'Z' }
