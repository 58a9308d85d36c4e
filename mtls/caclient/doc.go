// Package caclient is where workload certificates come from: Client turns an
// identity into a key, a CSR and, through a Signer, a verified
// mtls.WorkloadCert. Two Signers exist: IstioCA, which asks istiod's
// IstioCertificateService over gRPC (CA_ADDRESS), impersonating pods in shared
// mode as ztunnel does; and BuiltinCA, the embedded CA that signs those CSRs
// itself when no Istio CA is used (FAKE_CA, or a local config without
// CA_ADDRESS).
//
// This package imports identity, mtls, the generated CA API (api/caapi) and
// the control-plane dialer (xdsclient/controlplane); the daemon's wiring and
// test kits (mtls/tlstest, mtls/caclient/catest) import it, and mtls must not.
package caclient
