// Package xdstest is a test kit for xDS clients: a real delta ADS server
// (gRPC over TLS on a loopback port, go-control-plane's types on the wire)
// that holds resources, serves subscriptions as istiod does, pushes changes,
// restarts, and records every request with its stream's headers; plus TLS
// material for fake control-plane servers, cut from mtls/tlstest.
//
// Imports (of ours): mtls/tlstest. Imported by: mtls/caclient/catest and
// tests. Production code must not import it; controlplane's tests that use
// it are external (package controlplane_test), since tlstest reaches
// controlplane through mtls/caclient.
package xdstest
