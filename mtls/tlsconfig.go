package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/identity"
)

// alpnH2 is HBONE's only application protocol: HTTP/2 with prior knowledge.
const alpnH2 = "h2"

// ztunnel offers only the AES-GCM TLS 1.3 suites (no ChaCha20-Poly1305). Go's
// crypto/tls does not let a program choose TLS 1.3 cipher suites, so ours
// still offers TLS_CHACHA20_POLY1305_SHA256, but a handshake that negotiates
// it fails in VerifyConnection on either side (suites.go).

// Option adds a check to the configs ServerConfig and ClientConfig build.
type Option func(*options)

type options struct {
	crl *CRL
}

func optionsOf(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithCRL refuses, in the handshake, a peer any certificate of whose
// verified chain crl revokes (the error wraps ErrRevoked). A nil crl checks
// nothing.
func WithCRL(crl *CRL) Option {
	return func(o *options) { o.crl = crl }
}

// baseConfig returns the settings both sides share: TLS 1.3 only, ALPN h2,
// and no session resumption (ztunnel neither issues nor uses tickets, so every
// connection re-authenticates against the current certificates and roots).
func baseConfig() *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		NextProtos:             []string{alpnH2},
		SessionTicketsDisabled: true,
	}
}

// ServerConfig returns the HBONE server's config. cert is called once per
// handshake and returns the current certificate of the pod that owns the
// listener, so a rotated certificate takes effect on the next handshake.
//
// A client certificate is required; it must chain to the Roots of the
// certificate cert returned, not be a CA certificate, and carry a SPIFFE URI
// SAN (any of them, read as written: see identity.Parse) in the same trust
// domain as that certificate's Identity. A handshake that fails the chain
// check fails with a *tls.CertificateVerificationError wrapping the x509
// error; one whose leaf is a CA with an error wrapping ErrCAAsEndEntity; one
// that fails the trust-domain check with an error wrapping ErrTrustDomain;
// with WithCRL, one whose verified chain holds a revoked certificate with an
// error wrapping ErrRevoked.
func ServerConfig(cert func() (*WorkloadCert, error), opts ...Option) *tls.Config {
	o := optionsOf(opts)
	// The last per-certificate config, reused while the certificate is
	// unchanged so that a handshake does not build a config each time.
	var last atomic.Pointer[serverConfigFor]
	cfg := baseConfig()
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		refuseNonAESSuites(hello) // suites.go
		c, err := cert()
		if err != nil {
			return nil, fmt.Errorf("mtls: no server certificate: %w", err)
		}
		if c == nil {
			return nil, errors.New("mtls: no server certificate")
		}
		if l := last.Load(); l != nil && l.cert == c {
			return l.cfg, nil
		}
		l := &serverConfigFor{cert: c, cfg: serverConfigWith(c, o)}
		last.Store(l)
		return l.cfg, nil
	}
	return cfg
}

// serverConfigFor pairs a certificate with the config built for it.
type serverConfigFor struct {
	cert *WorkloadCert
	cfg  *tls.Config
}

// serverConfigWith builds the config of handshakes served with c.
func serverConfigWith(c *WorkloadCert, o options) *tls.Config {
	cfg := baseConfig()
	cfg.Certificates = []tls.Certificate{c.Certificate}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.ClientCAs = c.Roots
	td := c.Identity.TrustDomain
	// crypto/tls has verified the chain (and client-auth usage) by the time
	// this runs; what is left is webpki's refusal of a CA as the end entity
	// and ztunnel's trust-domain rule. Aliases are not supported, as in
	// ztunnel.
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: no client certificate", ErrNoIdentity)
		}
		if isCA(cs.PeerCertificates[0]) {
			return fmt.Errorf("client certificate: %w", ErrCAAsEndEntity)
		}
		// Revocation is checked on the chains crypto/tls verified, so a
		// CRL applies only through a signature of the issuer it names.
		if err := o.crl.Check(cs.VerifiedChains); err != nil {
			return fmt.Errorf("client certificate: %w", err)
		}
		ids := identities(cs.PeerCertificates[0])
		for _, id := range ids {
			if id.TrustDomain == td {
				return nil
			}
		}
		if len(ids) == 0 {
			return fmt.Errorf("%w: client certificate has no spiffe identity, want trust domain %q", ErrTrustDomain, td)
		}
		return fmt.Errorf("%w: client identities %v, want trust domain %q", ErrTrustDomain, ids, td)
	}
	return withSuiteCheck(cfg) // suites.go: AES-GCM only, as ztunnel
}

// ClientConfig returns the config for dialing an HBONE peer as cert's
// identity. cert must not be nil. The server's leaf must not be a CA
// certificate (ErrCAAsEndEntity otherwise), its chain must verify against
// cert.Roots, and one of its URI SANs, read as written, must be the same
// identity as one of expectedSANs (SPIFFE URIs such as
// "spiffe://cluster.local/ns/a/sa/b"; those that do not parse, DNS names
// among them, are ignored, as ztunnel ignores them). An expectedSANs with no
// identity accepts no server. A server that fails the identity check fails
// the handshake with an error wrapping ErrIdentityMismatch; one that fails
// the chain check with an error wrapping the x509 error; with WithCRL, one
// whose chain holds a revoked certificate with an error wrapping ErrRevoked.
//
// Our certificate is sent whatever CAs the server names in its request, so
// that a server mid-way through a root rotation can still decide for itself.
func ClientConfig(cert *WorkloadCert, expectedSANs []string, opts ...Option) *tls.Config {
	o := optionsOf(opts)
	cfg := baseConfig()
	own := cert.Certificate
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &own, nil
	}
	// No SNI is sent (ztunnel sends none, and the peer is found by address,
	// not by name), and crypto/tls refuses to verify a server without a
	// ServerName. So its own verification is switched off here and the
	// complete check (chain to cert.Roots, then the SAN match) is done in
	// VerifyConnection, which runs on every handshake, resumed or not.
	cfg.InsecureSkipVerify = true
	roots := cert.Roots
	want := expectedIdentities(expectedSANs)
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: server sent no certificate", ErrNoIdentity)
		}
		leaf := cs.PeerCertificates[0]
		// webpki checks the end entity's basic constraints before it
		// looks for an issuer; so do we.
		if isCA(leaf) {
			return fmt.Errorf("server certificate: %w", ErrCAAsEndEntity)
		}
		inters := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inters.AddCert(c)
		}
		chains, err := leaf.Verify(x509.VerifyOptions{
			Roots:         roots,
			Intermediates: inters,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("mtls: verifying server certificate: %w", err)
		}
		// Refused here, in the handshake, so a revoked server never sees
		// a CONNECT.
		if err := o.crl.Check(chains); err != nil {
			return fmt.Errorf("server certificate: %w", err)
		}
		for _, id := range identities(leaf) {
			if slices.Contains(want, id) {
				return nil
			}
		}
		return fmt.Errorf("%w: server URI SANs %q, want one of %v", ErrIdentityMismatch, uriSANs(leaf), want)
	}
	return withSuiteCheck(cfg) // suites.go: AES-GCM only, as ztunnel
}

// expectedIdentities parses the SANs a client expects of a server, skipping
// those that are not SPIFFE identities, as ztunnel's service_sans skips them
// (with a warning) before comparing identities: a DNS name never matches.
func expectedIdentities(sans []string) []identity.Identity {
	ids := make([]identity.Identity, 0, len(sans))
	for _, s := range sans {
		if id, err := identity.Parse(s); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// PeerIdentity returns the first SPIFFE identity in the peer's leaf
// certificate: the first URI SAN that identity.Parse accepts as written, as
// ztunnel's tls::identity takes it (a URI that is not a SPIFFE identity is
// skipped; one with empty segments is not: it decides, and authorization
// then sees its empty namespace or service account). It is meaningful only for connections whose handshake
// completed under ServerConfig or ClientConfig, which fail every handshake
// whose peer does not verify (on the client side crypto/tls leaves
// VerifiedChains empty because the check is ours, so the leaf is read from
// PeerCertificates).
func PeerIdentity(cs tls.ConnectionState) (identity.Identity, error) {
	if !cs.HandshakeComplete || len(cs.PeerCertificates) == 0 {
		return identity.Identity{}, fmt.Errorf("%w: no verified peer certificate", ErrNoIdentity)
	}
	ids := identities(cs.PeerCertificates[0])
	if len(ids) == 0 {
		return identity.Identity{}, ErrNoIdentity
	}
	return ids[0], nil
}
