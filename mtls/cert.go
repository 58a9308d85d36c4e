package mtls

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
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
	// ErrCAAsEndEntity means a peer presented a CA certificate (basic
	// constraints CA:true) as its own, which ztunnel's verifier (webpki)
	// refuses as CaUsedAsEndEntity.
	ErrCAAsEndEntity = errors.New("mtls: peer certificate is a CA certificate (basic constraints CA:true), not an end entity")
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

// oidSubjectAltName is the subject alternative name extension (RFC 5280
// section 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// uriSANs returns the URI SANs of c as the certificate spells them, in
// order. c.URIs will not do: crypto/x509 runs each URI through url.Parse,
// which lower-cases the scheme (and url.URL.String re-escapes the rest), so
// a SAN "SPIFFE://td/ns/a/sa/b" would read back as the identity
// "spiffe://td/ns/a/sa/b". ztunnel reads the SAN's IA5String as it is, and
// so do we. A SAN extension that does not decode yields nothing (crypto/x509
// has refused such a certificate before a handshake gets here).
func uriSANs(c *x509.Certificate) []string {
	for _, ext := range c.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		// GeneralNames ::= SEQUENCE OF GeneralName; a URI is the
		// primitive [6] IA5String.
		var seq asn1.RawValue
		if rest, err := asn1.Unmarshal(ext.Value, &seq); err != nil || len(rest) != 0 ||
			seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence || !seq.IsCompound {
			return nil
		}
		var uris []string
		for b := seq.Bytes; len(b) > 0; {
			var gn asn1.RawValue
			var err error
			if b, err = asn1.Unmarshal(b, &gn); err != nil {
				return nil
			}
			if gn.Class == asn1.ClassContextSpecific && gn.Tag == 6 && !gn.IsCompound {
				uris = append(uris, string(gn.Bytes))
			}
		}
		return uris
	}
	return nil
}

// firstURI returns the certificate's first URI SAN as written, the one
// ztunnel reads as its own certificate's identity; "" if there is none.
func firstURI(c *x509.Certificate) string {
	if uris := uriSANs(c); len(uris) > 0 {
		return uris[0]
	}
	return ""
}

// identities returns, in order, the identities of c's URI SANs that parse
// as SPIFFE identities (identity.Parse, ztunnel's from_str, on the SAN as
// written); others are skipped, as ztunnel's identities() skips them.
func identities(c *x509.Certificate) []identity.Identity {
	var ids []identity.Identity
	for _, u := range uriSANs(c) {
		if id, err := identity.Parse(u); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// isCA reports whether c says, in its basic constraints, that it is a CA.
// webpki, which ztunnel verifies peers with, refuses such a certificate as an
// end entity (CaUsedAsEndEntity); crypto/x509 does not look.
func isCA(c *x509.Certificate) bool {
	return c.BasicConstraintsValid && c.IsCA
}
