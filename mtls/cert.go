package mtls

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
)

var (
	// ErrIdentityMismatch means a certificate does not carry the identity it
	// was expected to: a CA answered with another identity, or an HBONE server
	// is not one of the identities the client expects.
	ErrIdentityMismatch = errors.New("mtls: certificate identity mismatch")
	// ErrTrustDomain means an HBONE client presented no SPIFFE identity in the
	// server's own trust domain.
	ErrTrustDomain = errors.New("mtls: peer is not in our trust domain")
	// ErrNoIdentity means a certificate carries no SPIFFE identity at all.
	ErrNoIdentity = errors.New("mtls: certificate has no spiffe identity")
)

// WorkloadCert is a workload's certificate chain, key and trusted roots.
// Immutable once created: rotation replaces the whole value, so a holder may
// keep using the pointer it loaded for the life of a connection.
type WorkloadCert struct {
	// Identity is the SPIFFE identity the leaf was checked to carry.
	Identity identity.Identity
	// Certificate holds the leaf and intermediates (DER), the private key, and
	// the parsed leaf in Leaf.
	Certificate tls.Certificate
	// Roots are the trust anchors for verifying peers: the CA response's root
	// bundle.
	Roots *x509.CertPool
	// RootsPEM is the root bundle as received, for config dumps.
	RootsPEM []byte
	// ChainPEM is the chain as received without the root bundle: the leaf
	// first, then intermediates.
	ChainPEM []string
	// NotBefore and NotAfter are the leaf's validity.
	NotBefore, NotAfter time.Time
}

// RefreshAt is when the certificate should be replaced: half way through its
// validity, as ztunnel does, leaving the second half to ride out CA outages.
func (c *WorkloadCert) RefreshAt() time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2)
}

// SerialNumber returns the leaf's serial number in decimal, the form ztunnel's
// config dump shows; "" if the leaf is missing.
func (c *WorkloadCert) SerialNumber() string {
	if c.Certificate.Leaf == nil || c.Certificate.Leaf.SerialNumber == nil {
		return ""
	}
	return c.Certificate.Leaf.SerialNumber.String()
}

// ParseChain builds a WorkloadCert from an Istio CA response. chainPEM[0] is
// the leaf, the middle entries are intermediates, and the last entry is the
// root bundle, which may hold several concatenated roots. Any entry may hold
// more than one PEM certificate (istiod sends its intermediates as one entry);
// extra certificates after the leaf count as intermediates.
//
// It checks that the leaf's first URI SAN is want (errors.Is(err,
// ErrIdentityMismatch) otherwise), that key belongs to the leaf, and that the
// leaf verifies against the roots now, through the intermediates.
func ParseChain(chainPEM []string, key crypto.Signer, want identity.Identity) (*WorkloadCert, error) {
	if want.IsZero() {
		return nil, errors.New("mtls: parse chain: no identity to check the leaf against")
	}
	if len(chainPEM) < 2 {
		return nil, fmt.Errorf("mtls: parse chain: %d entries, want a leaf and a root bundle at least", len(chainPEM))
	}
	if key == nil {
		return nil, errors.New("mtls: parse chain: no private key")
	}
	leafAndInter, err := parseCerts(chainPEM[0])
	if err != nil {
		return nil, fmt.Errorf("mtls: parse chain: leaf: %w", err)
	}
	leaf := leafAndInter[0]
	inters := leafAndInter[1:]
	for i, entry := range chainPEM[1 : len(chainPEM)-1] {
		certs, err := parseCerts(entry)
		if err != nil {
			return nil, fmt.Errorf("mtls: parse chain: intermediate entry %d: %w", i+1, err)
		}
		inters = append(inters, certs...)
	}
	rootsPEM := chainPEM[len(chainPEM)-1]
	roots, err := parseCerts(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("mtls: parse chain: root bundle: %w", err)
	}

	if got := firstURI(leaf); got != want.String() {
		return nil, fmt.Errorf("%w: leaf is %q, want %q", ErrIdentityMismatch, got, want)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return nil, errors.New("mtls: parse chain: private key does not match the leaf certificate")
	}

	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	interPool := x509.NewCertPool()
	der := make([][]byte, 0, 1+len(inters))
	der = append(der, leaf.Raw)
	for _, c := range inters {
		interPool.AddCert(c)
		der = append(der, c.Raw)
	}
	// Any usage: the same leaf serves as client and as server certificate, and
	// each handshake checks its own direction.
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: interPool,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("mtls: parse chain: leaf does not verify against the root bundle: %w", err)
	}

	return &WorkloadCert{
		Identity:    want,
		Certificate: tls.Certificate{Certificate: der, PrivateKey: key, Leaf: leaf},
		Roots:       pool,
		RootsPEM:    []byte(rootsPEM),
		ChainPEM:    append([]string(nil), chainPEM[:len(chainPEM)-1]...),
		NotBefore:   leaf.NotBefore,
		NotAfter:    leaf.NotAfter,
	}, nil
}

// parseCerts decodes every PEM block of s, which must all be certificates,
// and requires at least one.
func parseCerts(s string) ([]*x509.Certificate, error) {
	certs, err := ParseCertificatesPEM([]byte(s))
	if err == nil && len(certs) == 0 {
		err = errors.New("no pem certificate found")
	}
	return certs, err
}

// ParseCertificatesPEM decodes every PEM block of data, which must all be
// certificates, and returns them in order (none if data holds no PEM
// block: the caller words that error for its input). Text between blocks
// is skipped, as PEM files written by openssl often carry a human-readable
// dump. It is the one PEM chain parser of mtls and mtls/caclient.
func ParseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return certs, nil
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("pem block %q is not a CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
}

// firstURI returns the certificate's first URI SAN, the one ztunnel reads as
// the certificate's identity; "" if there is none.
func firstURI(c *x509.Certificate) string {
	if len(c.URIs) == 0 {
		return ""
	}
	return c.URIs[0].String()
}

// identities returns every URI SAN of c that is a SPIFFE identity, in order.
// URIs of other shapes are skipped, as ztunnel does.
func identities(c *x509.Certificate) []identity.Identity {
	var ids []identity.Identity
	for _, u := range c.URIs {
		if id, err := identity.Parse(u.String()); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}
