package controlplane

import "crypto/x509"

// RootPool returns the pool method of one root source for spec, so that the
// external tests can watch a root file being re-read as it changes. Those
// tests are external because the certificates come from xdstest, which
// reaches this package through mtls/tlstest and mtls/caclient: an internal
// test importing it would be an import cycle.
func RootPool(spec string) func() (*x509.CertPool, error) {
	return (&rootSource{spec: spec}).pool
}
