// Package app is the daemon: it turns ztunnel's environment variables into
// each package's Config, wires the packages together, runs them and drains
// them on shutdown. cmd/ztunnel is a thin main around it; tests run it
// in-process.
//
// Only cmd/ztunnel and tests import it.
package app
