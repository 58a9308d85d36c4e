package proxy

import (
	"net"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

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
