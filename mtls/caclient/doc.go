// Package caclient is where workload certificates come from: Client turns an
// identity into a key, a CSR and, through a Signer, a verified
// mtls.WorkloadCert. Two Signers exist: IstioCA, which asks istiod's
// IstioCertificateService over gRPC (CA_ADDRESS), impersonating pods in shared
// mode as ztunnel does; and BuiltinCA, the embedded CA that signs those CSRs
// itself when no Istio CA is used (FAKE_CA, or a local config without
// CA_ADDRESS).
//
// Imports (of ours): api/caapi (the generated CA API), identity, mtls and
// controlplane (the control-plane dialer). Imported by: bench/load,
// internal/app, internal/labrun, mtls/caclient/catest, mtls/tlstest and tests.
// mtls must not import it.
package caclient
