// Package mtls holds workload certificates and builds the crypto/tls
// configurations of HBONE's mutual TLS: TLS 1.3 with the AES-GCM suites only
// (as ztunnel), ALPN h2, no SNI, no session resumption, and peers verified by
// their SPIFFE identities rather than by host names; Policy adds the
// daemon-wide choices (COMPLIANCE_POLICY=pqc).
//
// It owns the per-identity certificate cache (Store) and its rotation, but not
// where certificates come from: a Source (the Istio CA client or the built-in
// CA, both in mtls/caclient) issues them. It also enforces certificate
// revocation lists (CRL, CRLSet, WithCRL): a file polled for changes whose
// lists refuse revoked peers in the handshake and tell subscribers when open
// connections must be re-checked.
//
// Any package that dials or serves HBONE, or dumps certificates, may import
// it, and it imports none of them. Imports (of ours): identity. Imported by:
// admin, bench/load, bench/peers, internal/app, internal/labrun,
// mtls/caclient, mtls/tlstest, proxy and tests. It is named mtls rather than
// tls so that importers can use crypto/tls beside it without an alias.
package mtls
