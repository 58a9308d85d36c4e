package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Handler serves one CONNECT request. It runs on its own goroutine per
// stream; ctx is cancelled when the stream is finished (both directions
// ended, reset, or closed) or its connection ends. The handler must call
// req.Respond; if it returns without doing so, 503 is sent. After
// Respond(200) the returned Stream belongs to the caller and outlives the
// handler.
type Handler func(ctx context.Context, req *ServerRequest)

// ServerRequest is a CONNECT request received by a Server. Requests that are
// not CONNECT or lack :authority are answered 400 without reaching the
// Handler.
type ServerRequest struct {
	Method    string
	Authority string
	// Header holds the request's regular header fields, canonicalized.
	Header http.Header
	// Conn is the underlying connection (for TLS state and addresses).
	Conn net.Conn

	s         *Stream
	responded atomic.Bool
}

// Respond sends the response HEADERS. Status 200 returns the tunnel stream;
// any other status ends the stream (END_STREAM) and returns nil, nil. hdr
// adds response headers (for example baggage).
func (r *ServerRequest) Respond(status int, hdr http.Header) (*Stream, error) {
	fields, err := responseFields(status, hdr)
	if err != nil {
		return nil, err
	}
	if !r.responded.CompareAndSwap(false, true) {
		return nil, ErrAlreadyResponded
	}
	return r.s.c.respond(r.s, status, fields)
}

// StreamID returns the request's HTTP/2 stream identifier.
func (r *ServerRequest) StreamID() uint32 { return r.s.id }

func (c *conn) respond(s *Stream, status int, fields []hpack.HeaderField) (*Stream, error) {
	c.mu.Lock()
	if s.werr != nil {
		err := s.werr
		c.mu.Unlock()
		return nil, err
	}
	if c.peerMaxHeaderList > 0 && headerListSize(fields) > c.peerMaxHeaderList {
		c.resetLocked(s, http2.ErrCodeInternal, ErrStreamClosed, true)
		c.unlock()
		s.abortRecv(ErrStreamClosed)
		return nil, errors.New("hbone: response headers exceed the peer's limit")
	}
	ok := status == http.StatusOK
	c.wmu.Lock()
	err := c.writeHeadersLocked(s.id, fields, !ok)
	if err == nil && !ok {
		s.endQueued = true
	}
	c.wmu.Unlock()
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	// On a server stream status is the answer sent; a reset by the client
	// after it is no longer a wasted stream (Config.MaxResetStreams).
	s.status = uint16(status) // 200-999 (responseFields)
	if ok {
		c.mu.Unlock()
		return s, nil
	}
	s.localClosed = true
	if !s.remoteClosed {
		// RFC 9113 section 8.1: the response is complete; ask the client to
		// stop sending without an error.
		c.resetLocked(s, http2.ErrCodeNo, ErrStreamClosed, true)
	} else {
		c.finishLocked(s)
		c.noteClosedLocked(s.id, closedPeerEnded)
	}
	c.unlock()
	s.abortRecv(ErrStreamClosed)
	return nil, nil
}

// Server accepts CONNECT streams on HTTP/2 connections.
type Server struct {
	cfg Config
	h   Handler

	mu           sync.Mutex // guards the following fields
	conns        map[*conn]struct{}
	shuttingDown bool
	closed       bool
	drained      chan struct{} // closed when conns empties during Shutdown

	serving sync.WaitGroup // connections started and not yet served (Start's done)
}

// NewServer returns a server that passes CONNECT requests to h.
func NewServer(cfg Config, h Handler) *Server {
	return &Server{cfg: cfg.withDefaults(true), h: h, conns: make(map[*conn]struct{})}
}

// ServeConn serves HTTP/2 on conn until the connection ends, and returns
// once its handlers have returned too. It validates the client preface,
// owns conn and closes it. Cancelling ctx closes the connection abruptly.
// It returns nil when the peer or a Shutdown ended the connection cleanly.
// It is Start and a wait for its done.
func (srv *Server) ServeConn(ctx context.Context, nc net.Conn) error {
	ended := make(chan error, 1)
	if err := srv.Start(ctx, nc, func(err error) { ended <- err }); err != nil {
		return err
	}
	return <-ended
}

// Start serves HTTP/2 on nc as ServeConn does, but returns as soon as the
// connection runs: once an event loop owns it (Config.Drive) or its reader
// and writer goroutines are started, so that no goroutine of the caller's
// waits for the connection's end. done is called once, with what ServeConn
// would return, when the connection has ended and its handlers have
// returned, on whichever goroutine finished last (the loop's, a
// handler's): it must not block. An error from Start (the server shutting
// down, Admit's refusal) means the connection never ran and done is never
// called; nc is closed.
func (srv *Server) Start(ctx context.Context, nc net.Conn, done func(error)) error {
	c := newConn(nc, srv.cfg, false)
	c.srv = srv
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.vals = context.WithoutCancel(ctx)
	c.takeDriver()
	srv.mu.Lock()
	if srv.shuttingDown {
		srv.mu.Unlock()
		c.abandon(ErrServerClosed)
		return ErrServerClosed
	}
	srv.conns[c] = struct{}{}
	srv.serving.Add(1)
	srv.mu.Unlock()
	if admit := srv.cfg.Admit; admit != nil {
		if err := admit(nc); err != nil {
			srv.forget(c)
			c.abandon(err)
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { c.forceClose(ctx.Err()) })
	// Set before the driver starts: only its end (and the handlers it
	// starts) lead to served.
	c.served = func() {
		stop()
		c.cancel()
		srv.forget(c)
		c.mu.Lock()
		err := c.closeErr
		c.mu.Unlock()
		if errors.Is(err, io.EOF) || errors.Is(err, errDrained) {
			err = nil // a clean end: the peer's, a Shutdown's
		}
		done(err)
	}
	if g := c.startDriver(); g != nil {
		go g.readLoop()
	}
	return nil
}

// forget removes c from the connections being served, once it has ended
// (or never ran).
func (srv *Server) forget(c *conn) {
	srv.mu.Lock()
	delete(srv.conns, c)
	if len(srv.conns) == 0 && srv.drained != nil {
		close(srv.drained)
		srv.drained = nil
	}
	srv.mu.Unlock()
	srv.serving.Done()
}

// Shutdown drains gracefully: GOAWAY on every connection, new streams are
// refused, and in-flight streams may finish until ctx is done; then the
// remaining connections are closed. New ServeConn calls fail.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	srv.shuttingDown = true
	conns := make([]*conn, 0, len(srv.conns))
	for c := range srv.conns {
		conns = append(conns, c)
	}
	var drained chan struct{}
	if len(srv.conns) > 0 {
		if srv.drained == nil {
			srv.drained = make(chan struct{})
		}
		drained = srv.drained
	}
	srv.mu.Unlock()
	for _, c := range conns {
		c.goAway()
	}
	if drained == nil {
		return nil
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		_ = srv.Close()
		return ctx.Err()
	}
}

// CloseConns closes abruptly, with cause, every connection being served
// whose network connection match accepts, and returns how many it closed;
// their ServeConn calls return cause. Abruptly as ztunnel does for a revoked
// peer: its streams fail at once, and the peer is sent GOAWAY(NO_ERROR) with
// the last stream processed before the transport closes (the flush bounded
// by closeFlushTimeout). match runs without the server's lock held.
func (srv *Server) CloseConns(match func(net.Conn) bool, cause error) int {
	srv.mu.Lock()
	conns := make([]*conn, 0, len(srv.conns))
	for c := range srv.conns {
		conns = append(conns, c)
	}
	srv.mu.Unlock()
	n := 0
	for _, c := range conns {
		if match(c.nc) {
			c.shutdown(cause, true, http2.ErrCodeNo, "", false)
			n++
		}
	}
	return n
}

// Close closes every connection abruptly and waits for ServeConn calls (and
// so their handlers) to return, and Start's done calls to be made. New
// ServeConn and Start calls fail.
func (srv *Server) Close() error {
	srv.mu.Lock()
	srv.shuttingDown = true
	srv.closed = true
	conns := make([]*conn, 0, len(srv.conns))
	for c := range srv.conns {
		conns = append(conns, c)
	}
	srv.mu.Unlock()
	// In parallel: each close may spend up to abruptCloseTimeout on the
	// TLS alert it owes a peer that stopped reading.
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.forceClose(ErrServerClosed) })
	}
	wg.Wait()
	srv.serving.Wait()
	return nil
}

// handleRequestHeaders opens a stream for a client's HEADERS, answers what
// the Handler must not see, and starts the Handler.
func (c *conn) handleRequestHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return connError(http2.ErrCodeProtocol, "client opened even stream %d", id)
	}
	if f.HasPriority() && f.Priority.StreamDep == id {
		// RFC 7540 section 5.3.1 (the priority fields RFC 9113 section
		// 6.2 still carries): a stream cannot depend on itself.
		return c.rejectStream(id, http2.ErrCodeProtocol, http2.FrameHeaders)
	}
	c.mu.Lock()
	if s := c.streams[id]; s != nil {
		if s.remoteClosed || !f.StreamEnded() {
			// RFC 9113 section 5.1: after the client's END_STREAM the
			// stream is half-closed (remote), and HEADERS there is
			// STREAM_CLOSED; trailers without END_STREAM are malformed
			// (section 8.1).
			code := http2.ErrCodeProtocol
			if s.remoteClosed {
				code = http2.ErrCodeStreamClosed
			}
			c.mu.Unlock()
			c.streamError(s, code)
			return c.spendReset()
		}
		// Trailers end the request body; their fields are of no use.
		s.remoteClosed = true
		c.maybeFinishLocked(s)
		c.unlock()
		s.endRecv(io.EOF)
		return nil
	}
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if id <= c.maxPeerID {
		skipped, how, last := c.skippedLocked(id), c.closedHowLocked(id), c.maxPeerID
		c.mu.Unlock()
		switch {
		case skipped:
			// RFC 9113 section 5.1.1: a new stream's identifier must be
			// above every one the client used; this one was skipped, so
			// these are no trailers either.
			return connError(http2.ErrCodeProtocol, "HEADERS on stream %d, below the client's last stream %d", id, last)
		case !f.StreamEnded():
			// Only trailers (which end the stream) may follow the
			// request's HEADERS; anything else reuses a closed stream's
			// identifier (section 5.1.1).
			return connError(http2.ErrCodeProtocol, "HEADERS on closed stream %d", id)
		case how&closedPeerReset != 0:
			// Section 5.1: nothing but PRIORITY may follow the client's
			// own RST_STREAM.
			return c.rstClosed(id, http2.ErrCodeStreamClosed)
		case how&closedPeerEnded != 0:
			// Section 5.1: the client ended the stream itself, so these
			// are no trailers that crossed our reset.
			return connError(http2.ErrCodeStreamClosed, "HEADERS on closed stream %d", id)
		}
		// Trailers on a stream we reset: they may have crossed our
		// RST_STREAM, and section 5.1 says to ignore them (so does a
		// stream older than the history, see history.go).
		return nil
	}
	c.openPeerIDLocked(id)
	ended := f.StreamEnded()
	var peerEnded closedHow // how a stream answered here closed
	if ended {
		peerEnded = closedPeerEnded
	}
	if c.goAwaySent || c.active >= int(c.cfg.MaxStreams) || c.running.Load() >= 2*int64(c.cfg.MaxStreams) {
		// RFC 9113 section 5.1.2: beyond the advertised limit, a stream
		// error of type REFUSED_STREAM, so the client may retry it.
		c.wmu.Lock()
		c.queueRSTLocked(id, http2.ErrCodeRefusedStream)
		c.wmu.Unlock()
		c.noteClosedLocked(id, peerEnded|closedLocalReset)
		c.mu.Unlock()
		return c.spendReset()
	}
	if f.Truncated {
		c.noteClosedLocked(id, c.rejectLocked(id, http.StatusRequestHeaderFieldsTooLarge, ended)|peerEnded)
		c.mu.Unlock()
		return c.spendReset()
	}
	req, status, code := parseRequest(f)
	if code != 0 {
		c.wmu.Lock()
		c.queueRSTLocked(id, code)
		c.wmu.Unlock()
		c.noteClosedLocked(id, peerEnded|closedLocalReset)
		c.mu.Unlock()
		return c.spendReset()
	}
	if status != 0 {
		c.noteClosedLocked(id, c.rejectLocked(id, status, ended)|peerEnded)
		c.mu.Unlock()
		return c.spendReset()
	}
	s := c.newStream(id)
	s.sendWindow = c.peerInitialWindow
	s.remoteClosed = ended
	ctx := &handlerCtx{c: c}
	s.cancel = ctx.cancel
	c.streams[id] = s
	c.active++
	c.mu.Unlock()
	if ended {
		s.endRecv(io.EOF)
	}
	req.s = s
	req.Conn = c.nc
	c.holds.Add(1)
	c.running.Add(1)
	go c.serve(ctx, req)
	return nil
}

// rejectLocked answers a request with status and ends its stream,
// resetting it (NO_ERROR) if the request had not ended: it returns
// closedLocalReset then, else 0. c.mu held.
func (c *conn) rejectLocked(id uint32, status int, ended bool) closedHow {
	fields, _ := responseFields(status, nil)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeHeadersLocked(id, fields, true) == nil && !ended {
		c.queueRSTLocked(id, http2.ErrCodeNo)
		return closedLocalReset
	}
	return 0
}

func (c *conn) serve(ctx context.Context, req *ServerRequest) {
	defer c.release()
	defer c.running.Add(-1)
	c.srv.h(ctx, req)
	if !req.responded.Load() {
		c.logf("hbone: handler for CONNECT %s returned without responding; sent 503", req.Authority)
		_, _ = req.Respond(http.StatusServiceUnavailable, nil)
	}
}

// parseRequest validates a request's header section. A non-zero code means
// the request is malformed (RST_STREAM); a non-zero status is answered
// without calling the Handler.
func parseRequest(f *http2.MetaHeadersFrame) (req *ServerRequest, status int, code http2.ErrCode) {
	var method, authority, path string
	var other bool   // :scheme, :path or :protocol: not a plain CONNECT
	var scheme bool  // :scheme present and not empty
	var hasPath bool // :path present
	for _, hf := range f.PseudoFields() {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":authority":
			authority = hf.Value
		case ":status":
			return nil, 0, http2.ErrCodeProtocol
		case ":scheme":
			scheme, other = hf.Value != "", true
		case ":path":
			path, hasPath, other = hf.Value, true, true
		default:
			other = true
		}
	}
	regular := f.RegularFields()
	for _, hf := range regular {
		if connectionSpecific(hf.Name) || hf.Name == "te" && hf.Value != "trailers" {
			return nil, 0, http2.ErrCodeProtocol
		}
	}
	switch {
	case method == "":
		return nil, 0, http2.ErrCodeProtocol
	case method != http.MethodConnect && (!scheme || !hasPath || path == ""):
		// RFC 9113 section 8.3.1: every request but CONNECT carries a
		// :scheme and a non-empty :path; without them it is malformed
		// (section 8.1.1), a stream error, whatever we would answer it.
		return nil, 0, http2.ErrCodeProtocol
	case method != http.MethodConnect, other, !validAuthority(authority):
		return nil, http.StatusBadRequest, 0
	}
	return &ServerRequest{Method: method, Authority: authority, Header: headerFromFields(regular)}, 0, 0
}

// handlerCtx is a server stream's handler context: the connection
// context's values and deadline, done when the stream is finished or its
// connection ends (the stream's cancel runs on both). A context.WithCancel
// child of the connection's context would keep, for the stream's whole
// life, a place in that context's children and the children map the first
// context derived from it (a dial timeout) makes: ~400 B per idle relayed
// stream. This one keeps its Done channel once asked for, and the contexts
// derived from it only while they last (through AfterFunc, which
// context.WithCancel and friends use in place of a children map).
type handlerCtx struct {
	c *conn

	mu    sync.Mutex // guards the following fields
	done  chan struct{}
	err   error
	after []*func() // AfterFunc callbacks not yet run or stopped
}

// Deadline is the connection context's.
func (h *handlerCtx) Deadline() (time.Time, bool) { return h.c.ctx.Deadline() }

// Value looks key up in the connection's context without its
// cancellation, which (as context.Cause would find it) is not this
// context's.
func (h *handlerCtx) Value(key any) any { return h.c.vals.Value(key) }

// Done returns a channel closed once the context is cancelled.
func (h *handlerCtx) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = make(chan struct{})
		if h.err != nil {
			close(h.done)
		}
	}
	return h.done
}

// Err is context.Canceled once the context is cancelled, else nil.
func (h *handlerCtx) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// AfterFunc arranges for f to run on a goroutine of its own once the
// context is cancelled; stop undoes that if f has not started. It is how
// contexts derived from h learn of its end (see context.AfterFunc).
func (h *handlerCtx) AfterFunc(f func()) (stop func() bool) {
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	e := &f
	h.after = append(h.after, e)
	h.mu.Unlock()
	return func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		i := slices.Index(h.after, e)
		if i < 0 {
			return false
		}
		h.after = slices.Delete(h.after, i, i+1)
		if len(h.after) == 0 {
			h.after = nil // an idle stream keeps no list
		}
		return true
	}
}

// cancel ends the context; calls after the first do nothing.
func (h *handlerCtx) cancel() {
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		return
	}
	h.err = context.Canceled
	if h.done != nil {
		close(h.done)
	}
	after := h.after
	h.after = nil
	h.mu.Unlock()
	for _, f := range after {
		go (*f)()
	}
}

func (h *handlerCtx) String() string { return "hbone stream context" }
