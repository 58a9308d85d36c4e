package mtls

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
)

var (
	// ErrRevoked means a certificate of the peer's chain is listed in a
	// certificate revocation list of its issuer.
	ErrRevoked = errors.New("mtls: certificate revoked")
	// ErrBadCRL means a CRL file could not be used: it does not parse, or a
	// CRL in it is not signed by the CA certificate it names as its issuer.
	ErrBadCRL = errors.New("mtls: bad certificate revocation list")
)

// pemCRL is the PEM block type of a CRL (RFC 7468 section 5).
const pemCRL = "X509 CRL"

// maxVerifyCache bounds the issuer certificates whose signature check a CRL
// remembers; issuers beyond it are checked on every use.
const maxVerifyCache = 64

// ParseCRLs reads a CRL file as ztunnel does: PEM when it starts with
// "-----BEGIN" (any number of "X509 CRL" blocks; blocks of other types are
// skipped), otherwise one DER CRL. An empty file, or PEM without a CRL block,
// holds no CRLs and is valid: it revokes nothing. Any error wraps ErrBadCRL.
func ParseCRLs(data []byte) ([]*x509.RevocationList, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, nil
	}
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		crl, err := x509.ParseRevocationList(data)
		if err != nil {
			return nil, fmt.Errorf("%w: DER: %w", ErrBadCRL, err)
		}
		return []*x509.RevocationList{crl}, nil
	}
	var out []*x509.RevocationList
	rest := trimmed
	for n := 1; len(rest) > 0; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: PEM block %d does not decode", ErrBadCRL, n)
		}
		rest = bytes.TrimSpace(rest)
		if block.Type != pemCRL {
			continue
		}
		crl, err := x509.ParseRevocationList(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: PEM block %d: %w", ErrBadCRL, n, err)
		}
		out = append(out, crl)
	}
	return out, nil
}

// CRLSet is a parsed set of CRLs indexed by issuer. Immutable once created
// (the signature cache inside is internally locked), so a handshake loads the
// current set once and may keep it.
//
// A CRL is applied to a certificate only when the certificate names the CRL's
// issuer and the CRL's signature verifies against that issuer's certificate:
// the next certificate of a verified chain, or a trust anchor of that name.
// Like ztunnel, the set ignores a CRL's NextUpdate (an expired CRL still
// revokes) and allows a certificate whose issuer has no CRL.
type CRLSet struct {
	byIssuer map[string][]*crlEntry // key: the CRL's raw issuer name
	n        int
	sum      [32]byte // of the file the set came from
}

// crlEntry is one CRL and what is known of its signature.
type crlEntry struct {
	crl     *x509.RevocationList
	revoked map[string]struct{} // serial numbers, as big.Int.String()
	// anchored is set when the signature verified against a trust anchor
	// at load: then the CRL applies even where the issuer's certificate is
	// not at hand (a presented chain that stops below the root).
	anchored bool

	mu       sync.Mutex      // guards the following field
	verified map[string]bool // issuer certificate (raw DER) -> signature verifies
}

// NewCRLSet indexes crls. Each CRL whose issuer name matches one of anchors
// (trust roots, or intermediates known now) must verify against one of
// them, or NewCRLSet fails with ErrBadCRL; a CRL from an issuer not among
// anchors (an intermediate of another cluster) is kept and checked against
// the issuing certificate whenever a verified chain presents it.
func NewCRLSet(crls []*x509.RevocationList, anchors []*x509.Certificate) (*CRLSet, error) {
	s := &CRLSet{byIssuer: make(map[string][]*crlEntry), n: len(crls)}
	for i, crl := range crls {
		e := &crlEntry{crl: crl, revoked: make(map[string]struct{}, len(crl.RevokedCertificateEntries)), verified: map[string]bool{}}
		for _, r := range crl.RevokedCertificateEntries {
			if r.SerialNumber != nil {
				e.revoked[r.SerialNumber.String()] = struct{}{}
			}
		}
		var why error // the last anchor of that name's reason to refuse
		for _, a := range anchors {
			if !bytes.Equal(a.RawSubject, crl.RawIssuer) {
				continue
			}
			if why = crlIssuerProblem(crl, a); why == nil {
				e.anchored = true
				e.verified[string(a.Raw)] = true
				break
			}
		}
		if why != nil && !e.anchored {
			return nil, fmt.Errorf("%w: CRL %d (issuer %q): %w", ErrBadCRL, i+1, crl.Issuer.String(), why)
		}
		s.byIssuer[string(crl.RawIssuer)] = append(s.byIssuer[string(crl.RawIssuer)], e)
	}
	return s, nil
}

// crlIssuerProblem says why crl does not verify against a, the CA
// certificate of its issuer's name, in words an operator can act on: a
// certificate that may not sign CRLs (not a CA, or a key usage without
// cRLSign) is not the same fault as a signature by another key.
func crlIssuerProblem(crl *x509.RevocationList, a *x509.Certificate) error {
	switch {
	case a.BasicConstraintsValid && !a.IsCA, a.Version == 3 && !a.BasicConstraintsValid:
		return errors.New("the certificate of that name is not a CA certificate")
	case a.KeyUsage != 0 && a.KeyUsage&x509.KeyUsageCRLSign == 0:
		return errors.New("the CA certificate of that name lacks the cRLSign key usage")
	}
	if err := crl.CheckSignatureFrom(a); err != nil {
		return fmt.Errorf("not signed by the CA certificate of that name (%w)", err)
	}
	return nil
}

// Len is the number of CRLs in the set.
func (s *CRLSet) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// Unanchored is the number of CRLs whose issuer was not among the anchors
// NewCRLSet was given: they are checked when a chain presents their issuer.
func (s *CRLSet) Unanchored() int {
	if s == nil {
		return 0
	}
	n := 0
	for _, es := range s.byIssuer {
		for _, e := range es {
			if !e.anchored {
				n++
			}
		}
	}
	return n
}

// Revoked returns the first certificate of chain (leaf first, each
// certificate followed by its issuer, as in a verified or presented chain)
// that a CRL of the set revokes. Self-signed certificates (trust anchors)
// are not checked. anchors are looked up for the issuer of a certificate
// whose issuer does not follow it in chain (a presented chain ends below
// the root).
func (s *CRLSet) Revoked(chain []*x509.Certificate, anchors []*x509.Certificate) (*x509.Certificate, bool) {
	if s.Len() == 0 {
		return nil, false
	}
	for i, c := range chain {
		es := s.byIssuer[string(c.RawIssuer)]
		if len(es) == 0 || c.SerialNumber == nil || bytes.Equal(c.RawIssuer, c.RawSubject) {
			continue
		}
		serial := c.SerialNumber.String()
		// The issuer follows in a verified chain; a presented chain may
		// stop below the root or carry a stray certificate of the same
		// name, so the anchors of that name are candidates too.
		var issuers []*x509.Certificate
		if i+1 < len(chain) && bytes.Equal(chain[i+1].RawSubject, c.RawIssuer) {
			issuers = append(issuers, chain[i+1])
		}
		for _, a := range anchors {
			if bytes.Equal(a.RawSubject, c.RawIssuer) {
				issuers = append(issuers, a)
			}
		}
		for _, e := range es {
			if _, ok := e.revoked[serial]; !ok {
				continue
			}
			if e.trusted(issuers) {
				return c, true
			}
		}
	}
	return nil, false
}

// trusted reports whether e's signature verifies against one of issuers or,
// with no issuer certificate at hand, whether it verified against an anchor
// at load.
func (e *crlEntry) trusted(issuers []*x509.Certificate) bool {
	if len(issuers) == 0 {
		return e.anchored
	}
	for _, is := range issuers {
		e.mu.Lock()
		ok, known := e.verified[string(is.Raw)]
		e.mu.Unlock()
		if !known {
			ok = e.crl.CheckSignatureFrom(is) == nil
			e.mu.Lock()
			if len(e.verified) < maxVerifyCache {
				e.verified[string(is.Raw)] = ok
			}
			e.mu.Unlock()
		}
		if ok {
			return true
		}
	}
	return false
}

// checkChains returns an error wrapping ErrRevoked when every one of chains
// has a revoked certificate (crypto/tls accepts a peer when any chain
// verifies, so one clean chain is enough).
func (s *CRLSet) checkChains(chains [][]*x509.Certificate) error {
	if s.Len() == 0 || len(chains) == 0 {
		return nil
	}
	var first *x509.Certificate
	for _, ch := range chains {
		c, revoked := s.Revoked(ch, nil)
		if !revoked {
			return nil
		}
		if first == nil {
			first = c
		}
	}
	return fmt.Errorf("%w: %q (serial %s) is listed by its issuer's CRL", ErrRevoked, first.Subject.String(), first.SerialNumber.String())
}

// newCRLSetFromFile parses and indexes the content of a CRL file.
func newCRLSetFromFile(data []byte, anchors []*x509.Certificate) (*CRLSet, error) {
	crls, err := ParseCRLs(data)
	if err != nil {
		return nil, err
	}
	s, err := NewCRLSet(crls, anchors)
	if err != nil {
		return nil, err
	}
	s.sum = sha256.Sum256(data)
	return s, nil
}

// revokedConn reports whether the chain a peer presented on a finished
// handshake has a revoked certificate under s.
func (s *CRLSet) revokedConn(cs tls.ConnectionState, anchors []*x509.Certificate) (*x509.Certificate, bool) {
	if len(cs.VerifiedChains) > 0 {
		// The server side keeps crypto/tls's verified chains (root
		// included); revoked unless one chain is clean.
		var first *x509.Certificate
		for _, ch := range cs.VerifiedChains {
			c, revoked := s.Revoked(ch, anchors)
			if !revoked {
				return nil, false
			}
			if first == nil {
				first = c
			}
		}
		return first, true
	}
	return s.Revoked(cs.PeerCertificates, anchors)
}
