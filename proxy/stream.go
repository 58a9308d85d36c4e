package proxy

import (
	"github.com/ztunnel-go/ztunnel/hbone"
	"golang.org/x/net/http2"
)

// streamEndpoint adapts an HBONE stream to engine.Endpoint: a reset of the
// plain side becomes RST_STREAM on the tunnel.
type streamEndpoint struct{ *hbone.Stream }

func (s streamEndpoint) Abort() error { return s.Stream.Reset(http2.ErrCodeCancel) }
