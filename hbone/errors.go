package hbone

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/net/http2"
)

var (
	// ErrConnClosed reports that the HTTP/2 connection has ended. Stream
	// errors caused by the end of their connection wrap it, together with the
	// cause (a [*GoAwayError], a [*ConnError], or a network error).
	ErrConnClosed = errors.New("hbone: connection closed")
	// ErrStreamClosed is returned by Read and Write on a stream that was
	// closed or reset locally. It matches net.ErrClosed with errors.Is.
	ErrStreamClosed error = streamClosedError{}
	// ErrStreamLimit is returned by ClientConn.Connect when the connection
	// has no free stream slot.
	ErrStreamLimit = errors.New("hbone: connection at its stream limit")
	// ErrGoingAway is returned by ClientConn.Connect when the connection is
	// draining (GOAWAY sent or received) and takes no new streams.
	ErrGoingAway = errors.New("hbone: connection is going away")
	// ErrRefused reports that the peer did not process a stream, so the
	// request may be retried on another connection: RST_STREAM with
	// REFUSED_STREAM (a [*StreamError] matches it with errors.Is), or a
	// stream above the last stream ID of a received GOAWAY.
	ErrRefused = errors.New("hbone: stream refused by peer")
	// ErrPoolClosed is returned by Pool.Connect after Pool.Close.
	ErrPoolClosed = errors.New("hbone: pool closed")
	// ErrServerClosed is returned by Server.ServeConn after Shutdown or Close.
	ErrServerClosed = errors.New("hbone: server closed")
	// ErrBadPreface reports a connection that did not start with the HTTP/2
	// client connection preface.
	ErrBadPreface = errors.New("hbone: bad connection preface")
	// ErrAlreadyResponded is returned by a second ServerRequest.Respond.
	ErrAlreadyResponded = errors.New("hbone: response already sent")
	// ErrWriteAfterClose is returned by Stream.Write after CloseWrite.
	ErrWriteAfterClose = errors.New("hbone: write after CloseWrite")
)

// errIdle and errDrained end connections that closed gracefully.
var (
	errIdle        = errors.New("hbone: idle connection released")
	errDrained     = errors.New("hbone: connection drained")
	errPingTimeout = errors.New("hbone: ping timeout")
	// errHeaderBlockTooLarge is what the framer's reader returns once a
	// header block exceeds Config.MaxHeaderBlockSize.
	errHeaderBlockTooLarge = errors.New("hbone: header block too large")
)

type streamClosedError struct{}

func (streamClosedError) Error() string        { return "hbone: stream closed" }
func (streamClosedError) Is(target error) bool { return target == net.ErrClosed }

// StatusError is returned by Connect when the server answers other than 200.
type StatusError struct {
	Code int
}

// Error reports the status code.
func (e *StatusError) Error() string {
	return fmt.Sprintf("hbone: CONNECT refused with status %d", e.Code)
}

// StreamError reports a reset stream: returned by Read and Write after the
// peer sent RST_STREAM, or after this side reset the stream because the peer
// broke a stream-level protocol rule (Local).
type StreamError struct {
	Code http2.ErrCode
	// Local is set when this endpoint sent the RST_STREAM because of a
	// protocol violation by the peer; false means the peer reset the stream.
	Local bool
}

// Error reports the reset code and which side reset.
func (e *StreamError) Error() string {
	if e.Local {
		return "hbone: stream reset locally: " + e.Code.String()
	}
	return "hbone: stream reset by peer: " + e.Code.String()
}

// Is makes a REFUSED_STREAM reset match ErrRefused.
func (e *StreamError) Is(target error) bool {
	return target == ErrRefused && e.Code == http2.ErrCodeRefusedStream
}

// GoAwayError reports that the peer ended the connection with a GOAWAY
// carrying an error code other than NO_ERROR.
type GoAwayError struct {
	LastStreamID uint32
	Code         http2.ErrCode
	DebugData    string
}

// Error reports the GOAWAY code and debug data.
func (e *GoAwayError) Error() string {
	if e.DebugData != "" {
		return fmt.Sprintf("hbone: peer sent GOAWAY %v: %q", e.Code, e.DebugData)
	}
	return fmt.Sprintf("hbone: peer sent GOAWAY %v", e.Code)
}

// ConnError reports a connection-level protocol violation by the peer; this
// side sent GOAWAY with Code and closed the connection.
type ConnError struct {
	Code   http2.ErrCode
	Reason string
}

// Error reports the code sent in GOAWAY and the reason.
func (e *ConnError) Error() string {
	return fmt.Sprintf("hbone: protocol error %v: %s", e.Code, e.Reason)
}

func connError(code http2.ErrCode, format string, args ...any) error {
	return &ConnError{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// connClosedError is what streams report when their connection ended with
// cause.
func connClosedError(cause error) error {
	if cause == nil || errors.Is(cause, ErrConnClosed) {
		return ErrConnClosed
	}
	return fmt.Errorf("%w: %w", ErrConnClosed, cause)
}
