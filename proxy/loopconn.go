package proxy

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// This file is where an HBONE connection's three parts meet, as ztunnel's
// connection spawner: the TLS records (mtls/record), the event loop that
// may own the socket (engine) and the HTTP/2 connection (hbone). The
// handlers (inbound.go, tunnel.go) make their TLS connections here and
// hand them to hbone; hbone offers them to LoopDrive. No other file of
// the package imports mtls/record.

// hboneTLS is the TLS connection under an HBONE connection, as the
// handlers use it: handshake, peer certificates, then hbone's.
type hboneTLS interface {
	net.Conn
	HandshakeContext(ctx context.Context) error
	ConnectionState() tls.ConnectionState
}

// serverTLS is the TLS server side of an HBONE connection accepted on c:
// mtls/record, which seals each batch of HBONE frames into records in one
// buffer and one syscall, and whose socket an event loop can own once the
// handshake is done (LoopDrive).
func serverTLS(c *net.TCPConn, cfg *tls.Config) hboneTLS { return record.Server(c, cfg) }

// clientTLS is the TLS client side of an HBONE connection dialled on c
// (as serverTLS).
func clientTLS(c *net.TCPConn, cfg *tls.Config) hboneTLS { return record.Client(c, cfg) }

// LoopDrive returns the hbone.Config.Drive that hands each HBONE connection
// over mtls/record to one of eng's event loops (the daemon's default): the
// loop reads its records, opens them and runs its frames, and the relays of
// its streams are placed on the same loop (streamEndpoint.Home), so a round
// trip crosses no goroutine (docs/design/hbone-loop.md). A connection the
// loops cannot take keeps hbone's reader and writer goroutines: a backend
// without loop-owned connections (std, uring), a TLS connection crypto/tls
// protects (a non-AES-GCM suite), a transport that is not a TCP socket.
func LoopDrive(eng *engine.Engine) func(net.Conn, hbone.Driven) (hbone.Owner, bool) {
	return func(nc net.Conn, d hbone.Driven) (hbone.Owner, bool) {
		rc, ok := nc.(*record.Conn)
		if !ok || !rc.CanUseFD() {
			return nil, false
		}
		tc, ok := rc.NetConn().(*net.TCPConn)
		if !ok {
			return nil, false
		}
		h, err := eng.TakeConn(tc, d, rc.UseFD)
		if err != nil {
			// ErrUnsupported leaves tc as it was; any other error closed
			// it, and the goroutines then end the connection at their
			// first read.
			return nil, false
		}
		return h, true
	}
}

// Home is the loop-owned connection carrying the stream (engine.Homed),
// nil when goroutines drive it: the engine places the stream's relay on
// that connection's loop.
func (s streamEndpoint) Home() *engine.ConnHandle {
	h, _ := s.Stream.Owner().(*engine.ConnHandle)
	return h
}

var (
	_ engine.Homed = streamEndpoint{}
	// The handle is hbone's owner as is (Home finds it again).
	_ hbone.Owner = (*engine.ConnHandle)(nil)
)
