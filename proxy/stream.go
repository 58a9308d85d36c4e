package proxy

import (
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"golang.org/x/net/http2"
)

// streamEndpoint is an HBONE stream as the engine relays it
// (engine.StreamEndpoint), in its event loops and without goroutines. It
// stays a separate adapter because hbone and engine may not import each
// other, and two names differ: the engine resets an endpoint with
// Abort, which for a stream is RST_STREAM(CANCEL) on the tunnel, and its
// SetWaker takes an engine.Waker where the stream's takes an hbone.Waker
// (the same method set; a nil one converts to nil). Every other method is
// the stream's own.
type streamEndpoint struct{ *hbone.Stream }

func (s streamEndpoint) Abort() error { return s.Stream.Reset(http2.ErrCodeCancel) }

func (s streamEndpoint) SetWaker(w engine.Waker) { s.Stream.SetWaker(w) }

// The loops use the stream's copy-free paths both ways: the socket writes
// from the stream's receive buffer (Peek) and reads into its send buffer
// (WriteFrom).
var (
	_ engine.StreamEndpoint = streamEndpoint{}
	_ engine.StreamPeeker   = streamEndpoint{}
	_ engine.StreamFiller   = streamEndpoint{}
)
