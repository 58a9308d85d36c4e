package proxy

import (
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"golang.org/x/net/http2"
)

// streamEndpoint adapts an HBONE stream to engine.StreamEndpoint, so the
// engine's event loops relay it without goroutines: a reset of the plain
// side becomes RST_STREAM on the tunnel.
type streamEndpoint struct{ *hbone.Stream }

func (s streamEndpoint) Abort() error { return s.Stream.Reset(http2.ErrCodeCancel) }

// SetWaker passes the engine's waker to the stream (the two Waker
// interfaces are the same method set under two names).
func (s streamEndpoint) SetWaker(w engine.Waker) {
	if w == nil {
		s.Stream.SetWaker(nil)
		return
	}
	s.Stream.SetWaker(w)
}

// The loops use the stream's copy-free paths both ways: the socket writes
// from the stream's receive buffer (Peek) and reads into its send buffer
// (WriteFrom).
var (
	_ engine.StreamEndpoint = streamEndpoint{}
	_ engine.StreamPeeker   = streamEndpoint{}
	_ engine.StreamFiller   = streamEndpoint{}
)
