// Package securityapi holds the Go types of the Istio L4 authorization API
// (istio.security.Authorization), generated from proto/authorization.proto by
// `make generate`; only this doc file is written by hand.
//
// Imports (of ours): api/workloadapi. Imported by: state/xdsconv and tests.
package securityapi
