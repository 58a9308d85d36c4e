package engine

import (
	"io"
	"net"
	"sync/atomic"
)

// Endpoint is one side of a relay: a byte stream that can half-close its
// write side and be aborted. *net.TCPConn satisfies it through TCPEndpoint;
// an HBONE stream through a small adapter in the proxy.
//
// A TCPEndpoint handed to an event-loop engine is taken over: the engine
// duplicates its descriptor, closes the *net.TCPConn at once and from then on
// owns the socket (reset the relay through its Handle). Other endpoints are relayed by goroutines and closed when
// the relay ends.
type Endpoint interface {
	io.ReadWriteCloser
	// CloseWrite half-closes: the peer reads EOF, the other direction goes on.
	CloseWrite() error
	// Abort tears the endpoint down so its peer sees a reset (TCP RST,
	// HTTP/2 RST_STREAM) rather than a clean end.
	Abort() error
}

// TCPEndpoint adapts a TCP connection to Endpoint.
type TCPEndpoint struct{ *net.TCPConn }

// Abort closes with SO_LINGER 0, which makes the kernel send RST. Once
// the endpoint is handed to an event loop its conn is closed and Abort does
// nothing: reset a running relay through its Handle.
func (t TCPEndpoint) Abort() error { return resetConn(t.TCPConn) }

// Counters are the byte counts of one relay, updated as bytes flow so that a
// long connection shows progress before it ends.
type Counters struct {
	// AToB counts bytes read from A and written to B.
	AToB atomic.Int64
	// BToA counts bytes read from B and written to A.
	BToA atomic.Int64
}

// Result reports how a relay ended.
type Result struct {
	// Err is the first error that ended a direction abnormally (a reset, a
	// write failure, ErrIdleTimeout, ErrClosed, the cause given to
	// Handle.Abort); nil when both directions ended with a clean EOF.
	Err error
}
