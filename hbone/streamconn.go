package hbone

import (
	"context"
	"errors"
	"net"
)

// Tunnels inside tunnels. A *Stream is a net.Conn with working deadlines,
// so a TLS session and a ClientConn (or a Pool dial) can run over a stream
// of another connection: that is double HBONE, where the outer CONNECT goes
// to a network gateway and the inner TLS + CONNECT reaches the destination
// through it. The deadlines matter there: crypto/tls bounds its close_notify
// write with one, so closing an inner connection cannot hang on an outer
// stream whose send window is exhausted.

// ConnectOnce starts HTTP/2 on nc, opens exactly one CONNECT stream and
// returns it. The connection takes no further stream and closes itself
// gracefully (flush, then close nc) once that stream has finished: both
// directions ended, or the stream was closed or reset. On error nc is
// closed before ConnectOnce returns.
//
// It is the unpooled inner connection of double HBONE: nc is typically a
// *tls.Conn over an outer *Stream, and closing nc closes that stream. The
// caller must eventually Close the returned stream, which is what ends the
// connection's goroutines.
func ConnectOnce(ctx context.Context, nc net.Conn, cfg Config, req *Request) (*Stream, error) {
	if nc == nil {
		return nil, errors.New("hbone: nil connection")
	}
	cc := newClientConn(nc, cfg.withDefaults(false), 0, nil)
	s, err := cc.Connect(ctx, req)
	if err != nil {
		_ = cc.Close()
		return nil, err
	}
	c := cc.c
	c.mu.Lock()
	// Refuse new streams from here on without telling the peer (a GOAWAY
	// would be noise for a connection that carries one stream anyway); once
	// the stream is gone, slotFreedLocked turns that into a graceful close.
	// The stream may already be finished: slotFreedLocked then drains now.
	c.goAwaySent = true
	c.slotFreedLocked()
	c.unlock()
	return s, nil
}
