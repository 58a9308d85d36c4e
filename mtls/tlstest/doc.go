// Package tlstest is the one test PKI of the module. It has two halves:
//
//   - the built-in CA path (NewCA, Cert): workload certificates issued
//     through the real caclient path (key, CSR, signing, mtls.ParseChain),
//     for tests that want exactly what the daemon gets, and WriteFiles to
//     hand one to a peer process (OpenSSL, GnuTLS, node, h2spec);
//   - hand-shaped chains (NewRoot, CA.Intermediate, CA.Leaf, CA.CRL,
//     SelfSigned, ServerConfig, ClientConfig), for what the built-in CA will
//     not make: intermediates, several trust domains on one root, DNS and IP
//     SANs, expired or not-yet-valid leaves, leaves of another trust domain,
//     CRLs revoking a serial, and plain crypto/tls configurations around them.
//     NewSelfSigned returns an error instead of taking a testing.TB, for a
//     certificate made once and shared by tests, benchmarks and fuzz targets.
//
// Every certificate gets a random serial, so CRLs made by one test never
// revoke another's certificates. Imports (of ours): identity, mtls and
// mtls/caclient. Imported by: hbone/hbonetest, mtls/caclient/catest,
// xdsclient/xdstest and tests.
package tlstest
