package hbone

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// Helpers for tests that build their own connections (interop with x/net
// and Node, h2spec) so that a loop-driven suite run drives them too.

// tlsConn is what both crypto/tls and mtls/record connections offer.
type tlsConn interface {
	net.Conn
	HandshakeContext(context.Context) error
	ConnectionState() tls.ConnectionState
}

// suiteTLS is TLS over nc for one side of a suite run: mtls/record when the
// run drives that side by the loop (record has the fd-mode face
// crypto/tls lacks), else crypto/tls as the test always had.
func suiteTLS(nc net.Conn, cfg *tls.Config, client bool) tlsConn {
	switch {
	case !loopDriven(overRecord, client):
	case client:
		return record.Client(nc, cfg)
	default:
		return record.Server(nc, cfg)
	}
	if client {
		return tls.Client(nc, cfg)
	}
	return tls.Server(nc, cfg)
}

// suiteConfig is cfg for one side of a suite run: with a test loop's Drive
// when the run drives that side by the loop. The loop stops at cleanup,
// after whatever the caller registers later.
func suiteConfig(t testing.TB, cfg Config, client bool) Config {
	t.Helper()
	if loopDriven(overRecord, client) {
		cfg.Drive = newTestLoop(t).drive
	}
	return cfg
}

// suiteServerTransport is the TLS transport of a test server that talks to
// a foreign client: mtls/record when the run drives servers by the loop,
// else crypto/tls.
func suiteServerTransport() transport {
	if loopDriven(overRecord, false) {
		return overRecord
	}
	return overTLS
}
