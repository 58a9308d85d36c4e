// Package caapi is the Istio certificate service (istio.v1.auth): the request
// and response messages, generated from proto/citadel.proto by `make
// generate`, and a hand-written gRPC client and server binding for
// IstioCertificateService (service.go), so that no gRPC code generator is
// needed.
//
// Imports (of ours): nothing of ours. Imported by: mtls/caclient and
// mtls/caclient/catest (the test CA server).
package caapi
