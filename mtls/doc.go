// Package mtls holds workload certificates and builds the crypto/tls
// configurations of HBONE's mutual TLS: TLS 1.3 with the AES-GCM suites only
// (as ztunnel), ALPN h2, no SNI, no session resumption, and peers verified by
// their SPIFFE identities rather than by host names; Policy adds the
// daemon-wide choices (COMPLIANCE_POLICY=pqc).
//
// It owns the per-identity certificate cache (Store) and its rotation, but not
// where certificates come from: a Source (the Istio CA client or the built-in
// CA, both in mtls/caclient) issues them.
//
// It imports only the standard library and identity. Any package that dials
// or serves HBONE, or dumps certificates, may import it; it imports none of
// them. It is named mtls rather than tls so that importers can use crypto/tls
// beside it without an alias.
package mtls
