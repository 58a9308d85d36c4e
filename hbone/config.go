package hbone

import (
	"math"
	"net"
	"time"
)

// Defaults, named after the ztunnel settings they mirror.
const (
	// DefaultStreamWindow is HTTP2_STREAM_WINDOW_SIZE.
	DefaultStreamWindow = 4 << 20
	// DefaultConnWindow is HTTP2_CONNECTION_WINDOW_SIZE.
	DefaultConnWindow = 16 << 20
	// DefaultMaxFrameSize is HTTP2_FRAME_SIZE.
	DefaultMaxFrameSize = 1 << 20
	// DefaultServerMaxStreams is what a server advertises as
	// SETTINGS_MAX_CONCURRENT_STREAMS.
	DefaultServerMaxStreams = 200
	// DefaultClientMaxStreams is POOL_MAX_STREAMS_PER_CONNECTION.
	DefaultClientMaxStreams = 100
	// DefaultClientMaxHeaderList is the client's SETTINGS_MAX_HEADER_LIST_SIZE.
	DefaultClientMaxHeaderList = 16 << 10
	// DefaultServerMaxHeaderList is the server's SETTINGS_MAX_HEADER_LIST_SIZE.
	DefaultServerMaxHeaderList = 64 << 10
	// DefaultPingInterval is the PING keepalive period.
	DefaultPingInterval = 10 * time.Second
	// DefaultPingTimeout is how long a PING may stay unacknowledged.
	DefaultPingTimeout = 20 * time.Second
	// DefaultMaxResetStreams is how many streams a peer may waste per
	// DefaultResetWindow before a server cuts it off (see
	// Config.MaxResetStreams).
	DefaultMaxResetStreams = 1000
	// DefaultResetWindow is the period over which MaxResetStreams refills.
	DefaultResetWindow = 10 * time.Second
	// DefaultMaxControlBacklog is how many bytes of frames provoked by the
	// peer may wait unsent (see Config.MaxControlBacklog).
	DefaultMaxControlBacklog = 256 << 10
)

// Protocol limits (RFC 9113).
const (
	initialWindow   = 65535     // section 6.9.2
	maxWindow       = 1<<31 - 1 // section 6.9.1
	minMaxFrameSize = 1 << 14   // section 6.5.2
	maxMaxFrameSize = 1<<24 - 1
	maxStreamID     = 1<<31 - 1
)

// Config tunes one HTTP/2 connection. Zero values mean the ztunnel defaults.
type Config struct {
	// StreamWindow is the initial per-stream receive window, advertised as
	// SETTINGS_INITIAL_WINDOW_SIZE. Default 4 MiB; values below 65535 are
	// raised to 65535 (a peer may send that much before it sees our SETTINGS).
	StreamWindow uint32
	// ConnWindow is the connection receive window. Default 16 MiB; at least
	// 65535, the protocol's initial value.
	ConnWindow uint32
	// MaxFrameSize is the SETTINGS_MAX_FRAME_SIZE we advertise and enforce.
	// Default 1 MiB, clamped to [16 KiB, 16 MiB-1].
	MaxFrameSize uint32
	// MaxStreams: a server advertises it as SETTINGS_MAX_CONCURRENT_STREAMS
	// and refuses streams beyond it (default 200); a client opens at most this
	// many streams per connection, further capped by the peer's setting
	// (default 100).
	MaxStreams uint32
	// MaxHeaderListSize is the SETTINGS_MAX_HEADER_LIST_SIZE we advertise and
	// enforce. Default 16 KiB for a client, 64 KiB for a server.
	MaxHeaderListSize uint32
	// PingInterval is the PING keepalive period, also the delay before the
	// first PING. Default 10s; negative disables keepalive PINGs.
	PingInterval time.Duration
	// PingTimeout closes the connection when a PING has not been acknowledged
	// for this long. Default 20s.
	PingTimeout time.Duration
	// MaxHeaderBlockSize bounds the bytes one header block may take on the
	// wire: its HEADERS frame and every CONTINUATION frame, frame headers
	// included. MaxHeaderListSize alone does not stop a peer that streams an
	// endless block (empty CONTINUATION frames decode to nothing); beyond
	// this the connection ends with GOAWAY ENHANCE_YOUR_CALM. Default twice
	// MaxHeaderListSize, at least 16 KiB.
	MaxHeaderBlockSize uint32
	// MaxResetStreams is how many streams a client may waste per
	// ResetWindow on a server: streams it resets before they were answered
	// (the HTTP/2 "rapid reset" attack, CVE-2023-44487), streams refused over
	// the concurrency limit or rejected without reaching the Handler, and
	// streams reset because the client broke a stream-level rule. Each costs
	// the server work the client never pays for. The budget refills
	// continuously at MaxResetStreams per ResetWindow; a client that
	// exhausts it gets GOAWAY ENHANCE_YOUR_CALM. Streams reset after their
	// response do not count (an application closing its connection with a
	// reset is ordinary traffic). Default 1000; clients ignore it.
	MaxResetStreams uint32
	// ResetWindow is the refill period of MaxResetStreams. Default 10s.
	ResetWindow time.Duration
	// MaxControlBacklog bounds the bytes of frames the peer provokes (PING
	// and SETTINGS acknowledgements, RST_STREAM, refusals) that may wait
	// unsent because the peer does not read: beyond it the connection ends
	// with GOAWAY ENHANCE_YOUR_CALM. Default 256 KiB.
	MaxControlBacklog uint32
	// Logf receives rare diagnostic messages (protocol errors, handler
	// misbehaviour). Nil discards them.
	Logf func(format string, args ...any)
	// Admit, when set, is asked about each new connection once a Server or
	// Pool has registered it, before it carries a stream of the server's or
	// the pool's caller; an error closes the connection with that cause.
	// Why after registering: a sweep over the open connections
	// (Server.CloseConns, Pool.CloseConns) that starts after the
	// registration sees the connection, and a check that starts before it
	// sees what the sweep's caller changed first (a CRL reload puts the new
	// revocations in force, then sweeps), so no connection verified against
	// the old state slips between the two.
	Admit func(net.Conn) error
	// Drive, when set, is offered each new connection whose transport has
	// a non-blocking face (mtls/record.Conn: TryRead, Drained, TryWriteLent,
	// TryFlush, TryClose) as soon as it is made, before it is registered,
	// admitted or started (NewClientConn and the Pool's dials,
	// Server.ServeConn), so that an event loop can drive it instead of a
	// reader and a writer goroutine (docs/design/hbone-loop.md). ok=true:
	// owner is the loop's handle for the connection, not started yet (the
	// proxy: engine.TakeConn with the record's UseFD as bind); hbone keeps
	// it as the connection's owner and calls its Start once the connection
	// may run (after Admit), and the loop calls d only from then on. owner
	// must be the engine's *ConnHandle itself, not a wrapper: hbone hands
	// it, as is, to the streams' relays. ok=false: d is never called; the
	// connection gets its goroutines.
	Drive func(nc net.Conn, d Driven) (owner Owner, ok bool)
}

// withDefaults returns cfg with zero values replaced by the defaults of the
// given role and out-of-range values clamped.
func (cfg Config) withDefaults(server bool) Config {
	if cfg.StreamWindow == 0 {
		cfg.StreamWindow = DefaultStreamWindow
	}
	cfg.StreamWindow = clamp(cfg.StreamWindow, initialWindow, maxWindow)
	if cfg.ConnWindow == 0 {
		cfg.ConnWindow = DefaultConnWindow
	}
	cfg.ConnWindow = clamp(cfg.ConnWindow, initialWindow, maxWindow)
	if cfg.MaxFrameSize == 0 {
		cfg.MaxFrameSize = DefaultMaxFrameSize
	}
	cfg.MaxFrameSize = clamp(cfg.MaxFrameSize, minMaxFrameSize, maxMaxFrameSize)
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = DefaultClientMaxStreams
		if server {
			cfg.MaxStreams = DefaultServerMaxStreams
		}
	}
	if cfg.MaxHeaderListSize == 0 {
		cfg.MaxHeaderListSize = DefaultClientMaxHeaderList
		if server {
			cfg.MaxHeaderListSize = DefaultServerMaxHeaderList
		}
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = DefaultPingTimeout
	}
	if cfg.MaxHeaderBlockSize == 0 {
		cfg.MaxHeaderBlockSize = uint32(min(max(2*uint64(cfg.MaxHeaderListSize), minMaxFrameSize), math.MaxUint32))
	}
	if cfg.MaxResetStreams == 0 {
		cfg.MaxResetStreams = DefaultMaxResetStreams
	}
	if cfg.ResetWindow <= 0 {
		cfg.ResetWindow = DefaultResetWindow
	}
	if cfg.MaxControlBacklog == 0 {
		cfg.MaxControlBacklog = DefaultMaxControlBacklog
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return cfg
}

func clamp(v, lo, hi uint32) uint32 {
	return min(max(v, lo), hi)
}
