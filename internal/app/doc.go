// Package app is the daemon: it turns ztunnel's environment variables into
// each package's Config, wires the packages together, runs them and drains
// them on shutdown. cmd/ztunnel is a thin main around it; tests run it
// in-process.
//
// Imports (of ours): admin, dnsproxy, engine, fdbudget, hbone, identity,
// inpod, internal/logging, metrics, mtls, mtls/caclient, proxy,
// proxy/connmgr, state, state/xdsconv, xdsclient and controlplane.
// Imported by: cmd/ztunnel and tests.
package app
