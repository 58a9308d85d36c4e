package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// Request is a CONNECT request.
type Request struct {
	// Authority is the tunnel target, "ip:port" or "host:port".
	Authority string
	// Header holds extra request headers (forwarded, baggage, traceparent,
	// ...). Names are lower-cased on the wire; connection-specific headers
	// and Host are dropped.
	Header http.Header
}

// ClientConn is one client HTTP/2 connection carrying CONNECT streams.
type ClientConn struct {
	c *conn
}

// NewClientConn starts HTTP/2 on conn: it queues the connection preface and
// SETTINGS and starts the connection's driver (an event loop through
// cfg.Drive, else a reader and a writer goroutine). The ClientConn owns
// conn from here on.
func NewClientConn(conn net.Conn, cfg Config) (*ClientConn, error) {
	if conn == nil {
		return nil, errors.New("hbone: nil connection")
	}
	return newClientConn(conn, cfg.withDefaults(false), 0, nil), nil
}

func newClientConn(nc net.Conn, cfg Config, idleTimeout time.Duration, onClose func(*ClientConn)) *ClientConn {
	cc := &ClientConn{c: newConn(nc, cfg, true)}
	cc.c.idleTimeout = idleTimeout
	if onClose != nil {
		cc.c.onClose = func() { onClose(cc) }
	}
	cc.c.takeDriver()
	if g := cc.c.startDriver(); g != nil {
		go g.readLoop()
	}
	return cc
}

// Connect opens a CONNECT stream and waits for the response. A 200 returns
// the tunnel; another status returns a *StatusError. It fails at once with
// ErrStreamLimit when the connection has no free stream slot and with
// ErrGoingAway (or an error wrapping ErrConnClosed) when it takes no new
// streams. Cancelling ctx before the response resets the stream.
func (cc *ClientConn) Connect(ctx context.Context, req *Request) (*Stream, error) {
	c := cc.c
	c.mu.Lock()
	if err := c.newStreamErrLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if c.active+c.reserved >= c.streamLimitLocked() {
		c.mu.Unlock()
		return nil, ErrStreamLimit
	}
	c.reserved++
	c.mu.Unlock()
	return cc.connectReserved(ctx, req)
}

// tryReserve takes a stream slot for a later connectReserved.
func (cc *ClientConn) tryReserve() bool {
	c := cc.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.canTakeLocked() {
		return false
	}
	c.reserved++
	return true
}

// notSentError marks a Connect that failed before its HEADERS were queued,
// so it may be retried elsewhere.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// connectReserved runs Connect with a slot taken by tryReserve.
func (cc *ClientConn) connectReserved(ctx context.Context, req *Request) (*Stream, error) {
	c := cc.c
	fields, err := requestFields(req)
	if err == nil {
		err = ctx.Err()
	}
	c.mu.Lock()
	c.reserved--
	if err == nil {
		if err = c.newStreamErrLocked(); err != nil {
			err = &notSentError{err}
		}
	}
	if err == nil && c.peerMaxHeaderList > 0 && headerListSize(fields) > c.peerMaxHeaderList {
		err = fmt.Errorf("hbone: request headers exceed the peer's limit of %d bytes", c.peerMaxHeaderList)
	}
	if err != nil {
		c.slotFreedLocked()
		c.unlock()
		return nil, err
	}
	s := c.newStream(c.nextID)
	c.nextID += 2
	s.sendWindow = c.peerInitialWindow
	respDone := make(chan struct{}) // s.respDone is dropped once closed
	s.respDone = respDone
	c.streams[s.id] = s
	c.active++
	c.wmu.Lock()
	err = c.writeHeadersLocked(s.id, fields, false)
	c.wmu.Unlock()
	if err != nil {
		// The writer failed; the connection is ending.
		s.localClosed, s.remoteClosed = true, true
		c.finishLocked(s)
		c.unlock()
		return nil, &notSentError{err}
	}
	c.mu.Unlock()

	select {
	case <-respDone:
	case <-ctx.Done():
		_ = s.Close()
		return nil, ctx.Err()
	}
	if s.respErr != nil {
		_ = s.Close()
		return nil, s.respErr
	}
	if s.status != http.StatusOK {
		_ = s.Close()
		return nil, &StatusError{Code: int(s.status)}
	}
	return s, nil
}

// CanTakeNewStream reports whether Connect could open a stream now: false if
// the connection is closed, draining (GOAWAY) or at its stream limit.
func (cc *ClientConn) CanTakeNewStream() bool {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return cc.c.canTakeLocked()
}

// NumActiveStreams returns the number of open streams.
func (cc *ClientConn) NumActiveStreams() int {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return cc.c.active
}

// Close closes the connection abruptly: every stream fails. It waits for the
// connection's goroutines to exit.
func (cc *ClientConn) Close() error {
	cc.c.forceClose(ErrConnClosed)
	<-cc.c.done
	return nil
}

// Shutdown drains the connection gracefully: GOAWAY, no new streams, and the
// connection closes once its open streams end. If ctx ends first the
// connection is closed abruptly and ctx's error returned.
func (cc *ClientConn) Shutdown(ctx context.Context) error {
	cc.c.goAway()
	select {
	case <-cc.c.done:
		return nil
	case <-ctx.Done():
		_ = cc.Close()
		return ctx.Err()
	}
}

// Done returns a channel closed when the connection is finished.
func (cc *ClientConn) Done() <-chan struct{} { return cc.c.done }

// Err returns why the connection ended, or nil while it is open.
func (cc *ClientConn) Err() error {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	if !cc.c.closed {
		return nil
	}
	return connClosedError(cc.c.closeErr)
}

// handleResponseHeaders processes HEADERS on a client stream: the response,
// interim 1xx responses, or trailers.
func (c *conn) handleResponseHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	c.mu.Lock()
	s := c.streams[id]
	if s == nil {
		idle := c.idleLocked(id)
		c.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol, "HEADERS on idle stream %d", id)
		}
		return nil
	}
	if s.remoteClosed {
		c.mu.Unlock()
		c.streamError(s, http2.ErrCodeStreamClosed)
		return nil
	}
	if s.gotResponse {
		// Trailers: they must end the stream; their fields are of no use to
		// a tunnel.
		if !f.StreamEnded() {
			c.mu.Unlock()
			c.streamError(s, http2.ErrCodeProtocol)
			return nil
		}
		s.remoteClosed = true
		c.maybeFinishLocked(s)
		c.unlock()
		s.endRecv(io.EOF)
		return nil
	}
	status, err := strconv.Atoi(f.PseudoValue("status"))
	if err != nil || status < 100 || status > 999 || f.Truncated {
		c.mu.Unlock()
		c.streamError(s, http2.ErrCodeProtocol)
		return nil
	}
	if status < 200 {
		c.mu.Unlock()
		if f.StreamEnded() {
			c.streamError(s, http2.ErrCodeProtocol)
		}
		return nil // interim response
	}
	s.gotResponse = true
	s.status = uint16(status) // 100-999
	if rf := f.RegularFields(); len(rf) > 0 {
		// A copy: the frame's slice holds the pseudo-fields too.
		s.respFields = slices.Clone(rf)
	}
	if f.StreamEnded() {
		s.remoteClosed = true
		c.maybeFinishLocked(s)
	}
	c.closeRespLocked(s, nil)
	c.unlock()
	if f.StreamEnded() {
		s.endRecv(io.EOF)
	}
	return nil
}
