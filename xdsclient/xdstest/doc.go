// Package xdstest is a test kit for xDS clients: a real delta ADS server
// (gRPC over TLS on a loopback port, go-control-plane's types on the wire)
// that holds resources, serves subscriptions as istiod does, pushes changes,
// restarts, and records every request with its stream's headers; plus TLS
// material for fake control-plane servers.
//
// Tests of xdsclient, state/xdsconv, mtls/caclient and the daemon import it;
// production code must not.
package xdstest
