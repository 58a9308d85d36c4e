package mtls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrCipherSuite marks a handshake that negotiated a cipher suite ztunnel
// never agrees to.
var ErrCipherSuite = errors.New("mtls: cipher suite refused")

// checkSuite refuses a handshake whose suite is not one of the AES-GCM TLS
// 1.3 suites, the only ones ztunnel offers or accepts (its rustls providers
// list TLS13_AES_256_GCM_SHA384 and TLS13_AES_128_GCM_SHA256). Go's
// crypto/tls cannot be told which TLS 1.3 suites to offer or accept: it
// offers and accepts TLS_CHACHA20_POLY1305_SHA256 too, and picks it when
// the peer prefers it (a peer without AES hardware). So the choice is
// checked once the handshake has made it, in VerifyConnection, which fails
// the handshake with an alert before any application data.
func checkSuite(cs tls.ConnectionState) error {
	switch cs.CipherSuite {
	case tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384:
		return nil
	}
	return fmt.Errorf("%w: %s (ztunnel accepts only the AES-GCM TLS 1.3 suites)", ErrCipherSuite, tls.CipherSuiteName(cs.CipherSuite))
}

// noSuite stands in for a suite a server must not pick: no cipher suite
// has the ID 0 (TLS_NULL_WITH_NULL_NULL), so nothing matches it.
const noSuite = 0x0000

// refuseNonAESSuites makes a server handshake with a client that offers no
// AES-GCM suite (ChaCha20-Poly1305 alone) fail as ztunnel's rustls server,
// which has only the AES-GCM suites, fails it: in the handshake, with
// handshake_failure, "no cipher suite supported by both client and
// server", not with bad_certificate after it (checkSuite). crypto/tls
// offers no setting for its TLS 1.3 suites, but the ClientHello it selects
// from is the slice GetConfigForClient sees (hello.CipherSuites), so the
// offer is blanked there before it selects. Only then: the selection fails
// at once, before a HelloRetryRequest could compare the second ClientHello
// with the first (which a blanked entry would fail as an illegal change).
// A client offering both and preferring ChaCha20 (no AES hardware) still
// gets it from crypto/tls and is refused by checkSuite after the handshake.
// checkSuite also stays behind this should a future Go copy the slice
// (TestServerSuiteRefusedInHandshake would then fail).
func refuseNonAESSuites(hello *tls.ClientHelloInfo) {
	for _, id := range hello.CipherSuites {
		if id == tls.TLS_AES_128_GCM_SHA256 || id == tls.TLS_AES_256_GCM_SHA384 {
			return
		}
	}
	for i, id := range hello.CipherSuites {
		if id == tls.TLS_CHACHA20_POLY1305_SHA256 {
			hello.CipherSuites[i] = noSuite
		}
	}
}

// withSuiteCheck runs checkSuite before cfg's own VerifyConnection.
func withSuiteCheck(cfg *tls.Config) *tls.Config {
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := checkSuite(cs); err != nil {
			return err
		}
		if verify != nil {
			return verify(cs)
		}
		return nil
	}
	return cfg
}

// Policy holds the daemon-wide TLS choices ztunnel takes from its
// environment. The zero value is ztunnel's default, which ClientConfig and
// ServerConfig use.
type Policy struct {
	// PQC restricts the key exchange to X25519MLKEM768 (COMPLIANCE_POLICY=pqc),
	// as ztunnel's pqc compliance policy does: a peer that cannot do it
	// fails the handshake.
	PQC bool
}

// pqcCurves is the pqc policy's only key exchange.
var pqcCurves = []tls.CurveID{tls.X25519MLKEM768}

// ClientConfig is ClientConfig under p.
func (p Policy) ClientConfig(cert *WorkloadCert, expectedSANs []string, opts ...Option) *tls.Config {
	cfg := ClientConfig(cert, expectedSANs, opts...)
	if p.PQC {
		cfg.CurvePreferences = pqcCurves
	}
	return cfg
}

// ServerConfig is ServerConfig under p.
func (p Policy) ServerConfig(cert func() (*WorkloadCert, error), opts ...Option) *tls.Config {
	cfg := ServerConfig(cert, opts...)
	if !p.PQC {
		return cfg
	}
	cfg.CurvePreferences = pqcCurves
	// The per-certificate config GetConfigForClient returns is what the
	// handshake uses: give it the curves too, copied once per certificate.
	type pair struct{ in, out *tls.Config }
	var last atomic.Pointer[pair]
	get := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := get(hello)
		if err != nil || c == nil {
			return c, err
		}
		if l := last.Load(); l != nil && l.in == c {
			return l.out, nil
		}
		out := c.Clone()
		out.CurvePreferences = pqcCurves
		last.Store(&pair{in: c, out: out})
		return out, nil
	}
	return cfg
}
