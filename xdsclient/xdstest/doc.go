// Package xdstest is a test kit for xDS clients: a real delta ADS server
// (gRPC over TLS on a loopback port, go-control-plane's types on the wire)
// that holds resources, serves subscriptions as istiod does, pushes changes,
// restarts, and records every request with its stream's headers; plus TLS
// material for fake control-plane servers.
//
// Imports (of ours): nothing of ours. Imported by: mtls/caclient/catest and
// tests. Production code must not import it.
package xdstest
