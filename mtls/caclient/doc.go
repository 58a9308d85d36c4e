// Package caclient is where workload certificates come from: Client turns an
// identity into a key, a CSR and, through a Signer, a verified
// mtls.WorkloadCert; BuiltinCA is the embedded CA that signs those CSRs when
// no Istio CA is used (FAKE_CA, or a local config without CA_ADDRESS).
//
// The gRPC signer for istiod's IstioCertificateService plugs in as another
// Signer. This package imports the standard library, identity and mtls; the
// daemon's wiring and test kits (mtls/tlstest) import it, and mtls must not.
package caclient
