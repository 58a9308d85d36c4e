package hbone

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

const (
	// readBufSize sizes the connection's bufio.Reader, which every
	// connection holds for its life. DATA payloads larger than what it
	// holds go straight from the connection into stream chunks, so a small
	// one costs less idle memory and fewer double copies.
	readBufSize = 4 << 10
	// closeFlushTimeout bounds the final flush (GOAWAY, pending frames) of a
	// connection that closes gracefully or with a protocol error.
	closeFlushTimeout = 2 * time.Second
	// abruptCloseTimeout bounds the alert (close_notify or fatal) a TLS
	// transport sends when the connection closes abruptly: after a network
	// error, a TLS failure, the peer's end, or a forced close.
	abruptCloseTimeout = 500 * time.Millisecond
	// lingerTimeout is how long such a connection, once flushed and
	// half-closed, waits for the peer to close before closing itself.
	lingerTimeout = time.Second
	// minDataFrag: a DATA frame is not split to fill less write-buffer space
	// than this.
	minDataFrag = 1 << 10
)

// netReader remembers the first error of the underlying connection, which
// tells network failures apart from malformed frames.
type netReader struct {
	nc  net.Conn
	err error
}

func (r *netReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

// blockReader is the framer's reader. While a header block is being read
// (left >= 0) it lets at most left more bytes through, so a peer cannot make
// the reader decode an endless run of CONTINUATION frames.
type blockReader struct {
	r        *bufio.Reader
	left     int64 // bytes the current header block may still take; -1: no block
	exceeded bool  // the budget ran out: the peer's block was too large
}

func (b *blockReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return b.r.Read(p)
	}
	if b.left == 0 {
		b.exceeded = true
		return 0, errHeaderBlockTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// conn is one HTTP/2 connection, client or server side. Its reader goroutine
// (readFrames) owns the framer and the receive path; its writer goroutine
// (writeLoop) owns the network writes. Streams and the reader append frames
// to a shared write buffer under wmu.
//
// Lock order: mu before wmu, mu before Stream.mu. Stream.mu and wmu are
// leaves: nothing is locked while holding them.
type conn struct {
	nc     net.Conn
	direct directWriter // nil unless the transport can write without blocking
	cfg    Config
	client bool
	logf   func(format string, args ...any)

	// Reader goroutine only.
	nr          netReader
	br          *bufio.Reader
	hr          blockReader // the framer reads through it
	fr          *http2.Framer
	gotSettings bool
	resetTokens float64   // server: streams the peer may still waste (see Config.MaxResetStreams)
	resetStamp  time.Time // when resetTokens was last refilled

	// Receive-side connection flow control. Atomic because stream readers
	// return credit from their own goroutines.
	recvConnAvail      atomic.Int64 // bytes the peer may still send
	connUnacked        atomic.Int64 // consumed bytes not yet returned by WINDOW_UPDATE
	streamAckThreshold int64
	connAckThreshold   int64

	mu                sync.Mutex // guards the following fields
	streams           map[uint32]*Stream
	active            int            // open streams (counted against the stream limit)
	reserved          int            // stream slots promised to pending Connects
	nextID            uint32         // client: next stream ID to open
	maxPeerID         uint32         // server: highest stream ID the peer opened
	hist              *streamHistory // server: how recent streams closed (history.go)
	closed            bool
	closeErr          error
	goAwaySent        bool
	goAwayRecv        bool
	goAwayErr         *GoAwayError
	drainNow          bool // set under mu; unlock() then closes the connection
	sendWindow        int64
	connWinCond       sync.Cond // writers waiting for connection send window
	connWinWaiters    int
	peerInitialWindow int64
	peerMaxStreams    uint32
	peerMaxHeaderList uint32
	pingOut           bool
	pingSent          time.Time
	pingData          [8]byte
	pingSeq           uint64
	pingTimer         *time.Timer
	idleTimeout       time.Duration
	idleSince         time.Time
	idleTimer         *time.Timer
	idleArmed         bool
	onClose           func()

	wmu           sync.Mutex // guards the following fields
	pending       *frameBuf  // frames queued for the writer; nil when empty and idle
	spare         *frameBuf  // the buffer the writer last flushed, for reuse
	wclosing      bool       // no more frames; the writer flushes and exits
	wErr          error      // what appenders get once wclosing
	writerWaiting bool
	// flushOwed asks the writer to flush what a direct write left held in
	// the transport.
	flushOwed bool
	// directWrites counts batches written by their committers, for tests.
	directWrites  uint64
	writerCond    sync.Cond
	bufCond       sync.Cond // streams waiting for write-buffer space
	bufWaiters    int
	wPeerMaxFrame int
	enc           *hpack.Encoder
	hbuf          bytes.Buffer
	poll          pollWaiters // event-loop streams waiting for window or buffer room

	closeNC sync.Once
	linger  atomic.Bool // close gracefully: flush, half-close, wait for the peer
	// writeFailed: the writer's write failed, so the transport owes the
	// peer nothing it could still send.
	writeFailed atomic.Bool
	readDone    chan struct{} // closed when the reader has stopped reading
	exits       atomic.Int32  // reader, writer and shutdown, when finished
	done        chan struct{} // closed when all three are

	// Server side.
	srv      *Server
	ctx      context.Context
	vals     context.Context // ctx's values without its cancellation, for handler contexts
	cancel   context.CancelFunc
	handlers sync.WaitGroup
	// running counts handler goroutines: streams reset right after opening
	// free their slot at once while their handlers may still run ("rapid
	// reset"), so handlers are capped on their own.
	running atomic.Int64
}

func newConn(nc net.Conn, cfg Config, client bool) *conn {
	c := &conn{
		nc:                 nc,
		cfg:                cfg,
		client:             client,
		logf:               cfg.Logf,
		streamAckThreshold: int64(cfg.StreamWindow / 2),
		connAckThreshold:   int64(cfg.ConnWindow / 2),
		streams:            make(map[uint32]*Stream),
		nextID:             1,
		sendWindow:         initialWindow,
		peerInitialWindow:  initialWindow,
		peerMaxStreams:     math.MaxUint32,
		wPeerMaxFrame:      minMaxFrameSize,
		readDone:           make(chan struct{}),
		done:               make(chan struct{}),
	}
	c.direct, _ = nc.(directWriter)
	c.nr.nc = nc
	c.br = bufio.NewReaderSize(&c.nr, readBufSize)
	c.hr = blockReader{r: c.br, left: -1}
	c.fr = http2.NewFramer(io.Discard, &c.hr)
	c.fr.SetMaxReadFrameSize(cfg.MaxFrameSize)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = cfg.MaxHeaderListSize
	c.recvConnAvail.Store(int64(cfg.ConnWindow))
	c.resetTokens = float64(cfg.MaxResetStreams)
	c.connWinCond.L = &c.mu
	c.writerCond.L = &c.wmu
	c.bufCond.L = &c.wmu
	c.enc = hpack.NewEncoder(&c.hbuf)

	settings := []http2.Setting{
		{ID: http2.SettingInitialWindowSize, Val: cfg.StreamWindow},
		{ID: http2.SettingMaxFrameSize, Val: cfg.MaxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxHeaderListSize},
	}
	if client {
		settings = append(settings, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	} else {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: cfg.MaxStreams})
	}
	b := c.wbufLocked()
	if client {
		b = append(b, http2.ClientPreface...)
	}
	b = appendSettings(b, settings)
	if cfg.ConnWindow > initialWindow {
		b = appendWindowUpdate(b, 0, cfg.ConnWindow-initialWindow)
	}
	c.pending.b = b
	return c
}

// start arms the keepalive and starts the writer goroutine; the caller runs
// readLoop (on a new goroutine or its own).
func (c *conn) start() {
	c.mu.Lock()
	c.pingSent = time.Now()
	if c.cfg.PingInterval > 0 {
		c.pingTimer = time.AfterFunc(c.cfg.PingInterval, c.onPingTimer)
	}
	c.mu.Unlock()
	go c.writeLoop()
}

// readLoop runs the reader until the connection ends.
func (c *conn) readLoop() {
	err := c.readFrames()
	close(c.readDone)
	c.closeWith(err)
	c.exit()
}

// exit is called once by the reader, once by the writer and once by the
// shutdown that ended the connection; the last one closes done, so Done
// implies that teardown (including the onClose hook) has completed.
func (c *conn) exit() {
	if c.exits.Add(1) == 3 {
		close(c.done)
	}
}

// closeConn closes the network connection, once, always through the
// transport's own Close: a TLS transport then sends what it owes the peer
// (close_notify, RFC 8446 section 6.1, or the fatal alert a failed read
// left owed, section 6.2), whichever side ended the connection and
// however. An abrupt close bounds that: to a peer that stopped reading,
// crypto/tls blocks on its close_notify for up to five seconds, holding
// the connection and its goroutines, so the transport under a TLS
// connection is closed after abruptCloseTimeout if Close has not returned
// (mtls/record bounds its own Close more tightly). After a failed write
// there is nothing left to send, and that transport is closed at once.
func (c *conn) closeConn(abrupt bool) {
	c.closeNC.Do(func() {
		if u, ok := c.nc.(interface{ NetConn() net.Conn }); ok && abrupt {
			if c.writeFailed.Load() {
				_ = u.NetConn().Close()
			} else {
				t := time.AfterFunc(abruptCloseTimeout, func() { _ = u.NetConn().Close() })
				defer t.Stop()
			}
		}
		_ = c.nc.Close()
	})
}

// ---- writing ----

// wbufLocked returns the pending buffer to append frames to. c.wmu held.
func (c *conn) wbufLocked() []byte {
	if c.pending == nil {
		c.pending = getFrameBuf()
	}
	return c.pending.b
}

// commitLocked stores the appended buffer and wakes the writer. c.wmu held.
func (c *conn) commitLocked(b []byte) {
	c.pending.b = b
	if c.writerWaiting {
		c.writerWaiting = false
		c.writerCond.Signal()
	}
}

// commitDirectLocked is commitLocked for an event loop (Stream.WriteFrom):
// when the writer is idle and the frames are few, the loop writes them
// itself if the transport can do so without blocking, so a request or
// response of a few bytes leaves without waking the writer goroutine. The
// writer only idles with nothing in flight, so nothing can overtake these
// frames; c.wmu keeps later appenders behind them. Goroutine callers (the
// reader's WINDOW_UPDATEs, handlers' HEADERS, Stream.Write) keep handing
// their frames to the writer: measured, writing themselves cost the
// connection rate ~10% (the writer's syscalls no longer ran beside the
// reader's work on the other core) for no clear latency gain.
func (c *conn) commitDirectLocked(b []byte) {
	if c.writerWaiting && c.direct != nil && len(b) <= directWriteMax {
		c.pending.b = b
		if c.writeDirectLocked() {
			return
		}
	}
	c.commitLocked(b)
}

// directWriteMax bounds the frames an event loop writes itself: above it,
// sealing and copying would hold the loop (and its other relays) too long,
// and the writer goroutine batches better.
const directWriteMax = 32 << 10

// directWriter is a transport that can take a write without blocking
// (mtls/record.Conn): ok=false means it took nothing; queued means part
// of it waits in the transport for a Flush.
type directWriter interface {
	TryWrite(p []byte) (ok, queued bool, err error)
	Flush() error
}

// writeDirectLocked writes the pending frames through c.direct. It reports
// false when the transport refused or failed; the writer goroutine then
// takes the frames (and meets the same error, ending the connection on its
// path). c.wmu held, the writer idle.
func (c *conn) writeDirectLocked() bool {
	ok, queued, err := c.direct.TryWrite(c.pending.b)
	if !ok || err != nil {
		return false
	}
	c.directWrites++
	// Sent or sealed: the buffer is free, and an idle connection pins none.
	putFrameBuf(c.pending)
	c.pending = nil
	if queued {
		c.flushOwed = true
		c.writerWaiting = false
		c.writerCond.Signal()
	}
	return true
}

func (c *conn) pendingLenLocked() int {
	if c.pending == nil {
		return 0
	}
	return len(c.pending.b)
}

// writeLoop flushes the pending buffer with one Write per batch: whatever
// streams append while a Write is in progress goes out in the next one.
func (c *conn) writeLoop() {
	defer c.exit()
	var err error
	c.wmu.Lock()
	for {
		if c.pendingLenLocked() == 0 {
			if c.flushOwed {
				c.flushOwed = false
				c.wmu.Unlock()
				err = c.direct.Flush()
				c.wmu.Lock()
				if err != nil {
					break
				}
				continue
			}
			if c.wclosing {
				break
			}
			// Idle: an idle connection pins no write buffer.
			if c.pending != nil {
				putFrameBuf(c.pending)
				c.pending = nil
			}
			if c.spare != nil {
				putFrameBuf(c.spare)
				c.spare = nil
			}
			c.writerWaiting = true
			c.writerCond.Wait()
			c.writerWaiting = false
			continue
		}
		out := c.pending
		c.pending, c.spare = c.spare, nil
		if c.bufWaiters > 0 {
			c.bufCond.Signal()
		}
		c.poll.wakeBuf()
		// A Write sends what a direct write left held first.
		c.flushOwed = false
		c.wmu.Unlock()
		err = c.write(out.b)
		c.wmu.Lock()
		out.b = out.b[:0]
		c.spare = out
		if err != nil {
			break
		}
	}
	if err != nil && !c.wclosing {
		c.wclosing = true
		c.wErr = connClosedError(err)
		c.bufCond.Broadcast()
	}
	c.wmu.Unlock()
	if err == nil && c.linger.Load() {
		c.lingerClose()
	}
	if err != nil {
		// The transport's write side failed: nothing, not even a TLS
		// alert, can follow what it cut. The cause is recorded before the
		// close, which would make the reader fail too.
		c.writeFailed.Store(true)
		c.closeWith(fmt.Errorf("hbone: write: %w", err))
	}
	c.closeConn(err != nil)
}

// write sends one batch with one Write (the daemon's mtls/record
// connection seals it and sends it with one syscall).
func (c *conn) write(b []byte) error {
	_, err := c.nc.Write(b)
	return err
}

// lingerClose half-closes a flushed connection and waits a little for the
// peer to close its side: closing at once, with peer bytes unread, makes
// the kernel reset the connection, and a reset can destroy the frames we
// just sent (GOAWAY above all) before the peer reads them.
func (c *conn) lingerClose() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	t := time.NewTimer(lingerTimeout)
	defer t.Stop()
	select {
	case <-c.readDone:
	case <-t.C:
	}
}

// rstClosed answers a frame on a stream that is no longer open with
// RST_STREAM(code), charged to the peer's reset budget. Reader goroutine.
func (c *conn) rstClosed(id uint32, code http2.ErrCode) error {
	c.wmu.Lock()
	c.queueRSTLocked(id, code)
	c.wmu.Unlock()
	return c.spendReset()
}

// queueRSTLocked queues RST_STREAM. c.wmu held.
func (c *conn) queueRSTLocked(id uint32, code http2.ErrCode) {
	if c.wclosing {
		return
	}
	b := c.wbufLocked()
	b = appendRSTStream(b, id, code)
	c.commitLocked(b)
}

// queueControl queues a frame provoked by the peer (a SETTINGS or PING
// acknowledgement) and cuts off a peer that provokes them faster than it
// reads.
func (c *conn) queueControl(ping bool, data [8]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosing {
		return nil
	}
	if err := c.backlogErrLocked(); err != nil {
		return err
	}
	b := c.wbufLocked()
	if ping {
		b = appendPing(b, true, data)
	} else {
		b = appendSettingsAck(b)
	}
	c.commitLocked(b)
	return nil
}

// backlogErrLocked cuts off a peer that keeps provoking frames (PING and
// SETTINGS acknowledgements, RST_STREAM, refusals) without reading them:
// they would otherwise pile up in the write buffer without bound. c.wmu
// held.
func (c *conn) backlogErrLocked() error {
	// Streams' DATA may legitimately fill writeBufCap of the buffer; only
	// what lies beyond it was provoked by the peer.
	if n := c.pendingLenLocked(); n > int(c.cfg.MaxControlBacklog)+writeBufCap {
		return connError(http2.ErrCodeEnhanceYourCalm, "%d bytes of frames queued for a peer that does not read them", n)
	}
	return nil
}

// checkBacklog is backlogErrLocked for the reader, after a frame that may
// have queued an answer.
func (c *conn) checkBacklog() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosing {
		return nil
	}
	return c.backlogErrLocked()
}

// spendReset charges one wasted stream (see Config.MaxResetStreams) to the
// peer and ends the connection once its budget is gone. Server reader
// goroutine only; clients do not count.
func (c *conn) spendReset() error {
	if c.client {
		return nil
	}
	now := time.Now()
	limit := float64(c.cfg.MaxResetStreams)
	if !c.resetStamp.IsZero() {
		refill := now.Sub(c.resetStamp).Seconds() / c.cfg.ResetWindow.Seconds() * limit
		c.resetTokens = min(c.resetTokens+refill, limit)
	}
	c.resetStamp = now
	c.resetTokens--
	if c.resetTokens < 0 {
		return connError(http2.ErrCodeEnhanceYourCalm, "more than %d streams reset, refused or rejected within %v", c.cfg.MaxResetStreams, c.cfg.ResetWindow)
	}
	return nil
}

// writeHeadersLocked HPACK-encodes fields and queues them as HEADERS (+
// CONTINUATION). c.wmu held; the caller orders stream creation under c.mu so
// stream IDs go out in increasing order.
func (c *conn) writeHeadersLocked(id uint32, fields []hpack.HeaderField, end bool) error {
	if c.wclosing {
		return c.wErr
	}
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return err // bytes.Buffer does not fail
		}
	}
	b := c.wbufLocked()
	b = appendHeaderBlock(b, id, end, c.hbuf.Bytes(), c.wPeerMaxFrame)
	c.commitLocked(b)
	return nil
}

// queueErrLocked reports why s may queue no more DATA: the connection's
// writer is closing, or the stream was reset or ended on our side. c.wmu
// held.
func (s *Stream) queueErrLocked() error {
	c := s.c
	switch {
	case c.wclosing:
		return c.wErr
	case s.rstQueued:
		return ErrStreamClosed
	case s.endQueued:
		return ErrWriteAfterClose
	}
	return nil
}

// sendData queues p as DATA frames of s, waiting for write-buffer space. The
// caller holds flow-control credit for all of p. It returns how many bytes it
// queued.
func (c *conn) sendData(s *Stream, p []byte) (sent int, err error) {
	c.wmu.Lock()
	defer func() {
		// Pass the wakeup on while there is room, so waiters are woken one
		// at a time instead of in a herd.
		if c.bufWaiters > 0 && c.pendingLenLocked() < writeBufSize {
			c.bufCond.Signal()
		}
		c.wmu.Unlock()
	}()
	for len(p) > 0 {
		if err := s.queueErrLocked(); err != nil {
			return sent, err
		}
		if s.wdeadlineHit.Load() {
			return sent, deadlineExceeded
		}
		k := min(len(p), c.wPeerMaxFrame)
		if used := c.pendingLenLocked(); used > 0 {
			// Append whole frames up to the soft limit; split one only to
			// fill worthwhile room.
			room := writeBufCap - used - frameHeaderLen
			if used >= writeBufSize || room < min(k, minDataFrag) {
				c.bufWaiters++
				c.bufCond.Wait()
				c.bufWaiters--
				continue
			}
			k = min(k, room)
		}
		b := c.wbufLocked()
		b = appendData(b, s.id, false, p[:k])
		c.commitLocked(b)
		p = p[k:]
		sent += k
	}
	return sent, nil
}

// ---- flow control (receive side) ----

// consumed returns n bytes of connection window: read by a stream, discarded,
// or padding. WINDOW_UPDATE goes out once half the window is consumed.
func (c *conn) consumed(n int) {
	if n <= 0 || c.connUnacked.Add(int64(n)) < c.connAckThreshold {
		return
	}
	v := c.connUnacked.Swap(0)
	if v <= 0 {
		return
	}
	// Credit before the frame can reach the peer.
	c.recvConnAvail.Add(v)
	c.wmu.Lock()
	if !c.wclosing {
		b := c.wbufLocked()
		b = appendWindowUpdate(b, 0, uint32(v))
		c.commitLocked(b)
	}
	c.wmu.Unlock()
}

// queueStreamWindowUpdate returns inc bytes of s's window to the peer.
func (c *conn) queueStreamWindowUpdate(s *Stream, inc int64) {
	c.wmu.Lock()
	if !c.wclosing && !s.rstQueued {
		b := c.wbufLocked()
		b = appendWindowUpdate(b, s.id, uint32(inc))
		c.commitLocked(b)
	}
	c.wmu.Unlock()
}

// ---- stream bookkeeping ----

func (c *conn) newStream(id uint32) *Stream {
	s := &Stream{c: c, id: id, recvWindow: int64(c.cfg.StreamWindow)}
	return s
}

// streamLimitLocked is how many streams this client may have open.
func (c *conn) streamLimitLocked() int {
	return int(min(c.cfg.MaxStreams, c.peerMaxStreams))
}

func (c *conn) canTakeLocked() bool {
	return c.newStreamErrLocked() == nil && c.active+c.reserved < c.streamLimitLocked()
}

// newStreamErrLocked reports why the connection takes no new streams at all.
func (c *conn) newStreamErrLocked() error {
	switch {
	case c.closed:
		return connClosedError(c.closeErr)
	case c.goAwayRecv || c.goAwaySent || c.nextID > maxStreamID:
		return ErrGoingAway
	}
	return nil
}

// idleLocked reports whether id names a stream that was never opened.
func (c *conn) idleLocked(id uint32) bool {
	if id%2 == 0 {
		return true // neither side opens even (server-initiated) streams
	}
	if c.client {
		return id >= c.nextID
	}
	return id > c.maxPeerID
}

func (c *conn) lastPeerIDLocked() uint32 {
	if c.client {
		return 0
	}
	return c.maxPeerID
}

// finishLocked retires a stream that is closed on the wire.
func (c *conn) finishLocked(s *Stream) {
	if s.finished {
		return
	}
	s.finished = true
	if c.streams[s.id] == s {
		delete(c.streams, s.id)
		c.active--
	}
	if s.cancel != nil {
		s.cancel()
	}
	c.slotFreedLocked()
}

// maybeFinishLocked retires s once END_STREAM went both ways.
func (c *conn) maybeFinishLocked(s *Stream) {
	if s.localClosed && s.remoteClosed {
		c.finishLocked(s)
		c.noteClosedLocked(s.id, closedPeerEnded)
	}
}

// slotFreedLocked runs when a stream or reservation ends: a draining
// connection closes once empty, a pooled one starts its idle clock.
func (c *conn) slotFreedLocked() {
	if c.closed || c.active+c.reserved > 0 {
		return
	}
	if c.goAwaySent || c.goAwayRecv || c.nextID > maxStreamID {
		c.drainNow = true
		return
	}
	if c.idleTimeout > 0 {
		c.idleSince = time.Now()
		if !c.idleArmed {
			c.idleArmed = true
			if c.idleTimer == nil {
				c.idleTimer = time.AfterFunc(c.idleTimeout, c.onIdleTimer)
			} else {
				c.idleTimer.Reset(c.idleTimeout)
			}
		}
	}
}

// unlock releases c.mu and closes the connection if it just drained.
func (c *conn) unlock() {
	drain := c.drainNow
	c.drainNow = false
	c.mu.Unlock()
	if drain {
		c.shutdown(errDrained, false, 0, "", true)
	}
}

// resetLocked closes s because of a reset: RST_STREAM(code) is queued if
// sendRST and the stream is still open on the wire; werr is what the
// stream's writer (and a waiting Connect) gets.
func (c *conn) resetLocked(s *Stream, code http2.ErrCode, werr error, sendRST bool) {
	if s.reset {
		return
	}
	var how closedHow // for the history of a server stream
	if s.remoteClosed {
		how = closedPeerEnded // not by a reset: s.reset is false
	}
	if sendRST && !(s.localClosed && s.remoteClosed) && !c.closed {
		c.wmu.Lock()
		if !s.rstQueued {
			s.rstQueued = true
			c.queueRSTLocked(s.id, code)
			if c.bufWaiters > 0 {
				c.bufCond.Broadcast() // this stream's writer may wait for space
			}
		}
		c.wmu.Unlock()
		how |= closedLocalReset
	}
	s.reset = true
	s.localClosed, s.remoteClosed = true, true
	if s.werr == nil {
		s.werr = werr
	}
	s.wakeWriterLocked()
	if c.connWinWaiters > 0 {
		c.connWinCond.Broadcast()
	}
	c.closeRespLocked(s, werr)
	c.finishLocked(s)
	c.noteClosedLocked(s.id, how)
}

// closeRespLocked ends a client stream's wait for its response.
func (c *conn) closeRespLocked(s *Stream, err error) {
	if s.respDone != nil && !s.respClosed {
		s.respClosed = true
		s.respErr = err
		close(s.respDone)
		s.respDone = nil // Connect holds its own reference; an idle stream none
	}
}

// streamError resets s because the peer broke a stream-level rule.
func (c *conn) streamError(s *Stream, code http2.ErrCode) {
	err := &StreamError{Code: code, Local: true}
	c.mu.Lock()
	c.resetLocked(s, code, err, true)
	c.unlock()
	s.abortRecv(err)
}

// ---- closing ----

// closeWith ends the connection after its reader or writer failed with err.
func (c *conn) closeWith(err error) {
	var ce *ConnError
	if errors.As(err, &ce) {
		c.logf("hbone: closing connection to %v: %v", c.nc.RemoteAddr(), err)
		c.shutdown(err, true, ce.Code, ce.Reason, false)
		return
	}
	c.shutdown(err, false, 0, "", false)
}

// shutdown ends the connection: every stream fails with cause, GOAWAY(code)
// is queued if goAway, and the network connection is closed: at once, or
// after the writer flushed what is queued if goAway or graceful.
func (c *conn) shutdown(cause error, goAway bool, code http2.ErrCode, debug string, graceful bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	var ce *ConnError
	if c.goAwayErr != nil && !errors.As(cause, &ce) {
		cause = c.goAwayErr // the peer told us why before hanging up
	}
	c.closeErr = cause
	streams := c.streams
	c.streams = nil
	c.active, c.reserved = 0, 0
	if c.pingTimer != nil {
		c.pingTimer.Stop()
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	serr := connClosedError(cause)
	for _, s := range streams {
		s.finished = true
		s.localClosed, s.remoteClosed = true, true
		if s.werr == nil {
			s.werr = serr
		}
		s.wakeWriterLocked()
		c.closeRespLocked(s, serr)
		if s.cancel != nil {
			s.cancel()
		}
	}
	c.connWinCond.Broadcast()
	c.wmu.Lock()
	if goAway && !c.wclosing {
		b := c.wbufLocked()
		b = appendGoAway(b, c.lastPeerIDLocked(), code, debug)
		c.commitLocked(b)
	}
	if !c.wclosing {
		c.wclosing = true
		c.wErr = serr
	}
	c.writerCond.Signal()
	c.bufCond.Broadcast()
	c.wmu.Unlock()
	onClose := c.onClose
	c.mu.Unlock()

	for _, s := range streams {
		s.endRecv(serr)
	}
	if goAway || graceful {
		// The writer flushes and closes; do not let a peer that stopped
		// reading hold it forever.
		c.linger.Store(true)
		_ = c.nc.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	} else {
		c.closeConn(true)
	}
	if c.cancel != nil {
		c.cancel()
	}
	if onClose != nil {
		onClose()
	}
	c.exit()
}

// forceClose closes the connection now, cutting short a graceful close in
// progress.
func (c *conn) forceClose(cause error) {
	c.shutdown(cause, false, 0, "", false)
	c.closeConn(true)
}

// goAway starts a graceful drain: GOAWAY(NO_ERROR) with the last stream this
// side will process; the connection closes once its streams are done.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.closed || c.goAwaySent {
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true
	c.wmu.Lock()
	if !c.wclosing {
		b := c.wbufLocked()
		b = appendGoAway(b, c.lastPeerIDLocked(), http2.ErrCodeNo, "")
		c.commitLocked(b)
	}
	c.wmu.Unlock()
	c.slotFreedLocked()
	c.unlock()
}

// ---- timers ----

// onPingTimer sends a keepalive PING every PingInterval and closes the
// connection when one stays unacknowledged for PingTimeout.
func (c *conn) onPingTimer() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	interval, timeout := c.cfg.PingInterval, c.cfg.PingTimeout
	if c.pingOut {
		if waited := now.Sub(c.pingSent); waited < timeout {
			c.pingTimer.Reset(timeout - waited)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.logf("hbone: no PING acknowledgement from %v in %v; closing", c.nc.RemoteAddr(), timeout)
		c.shutdown(errPingTimeout, false, 0, "", false)
		return
	}
	if since := now.Sub(c.pingSent); since < interval {
		c.pingTimer.Reset(interval - since)
		c.mu.Unlock()
		return
	}
	c.pingSeq++
	var data [8]byte
	for i := range data {
		data[i] = byte(c.pingSeq >> (56 - 8*i))
	}
	c.pingOut, c.pingSent, c.pingData = true, now, data
	c.pingTimer.Reset(min(interval, timeout))
	c.wmu.Lock()
	if !c.wclosing {
		b := c.wbufLocked()
		b = appendPing(b, false, data)
		c.commitLocked(b)
	}
	c.wmu.Unlock()
	c.mu.Unlock()
}

// onIdleTimer releases a pooled connection that had no stream for
// idleTimeout.
func (c *conn) onIdleTimer() {
	c.mu.Lock()
	c.idleArmed = false
	if c.closed || c.active+c.reserved > 0 {
		c.mu.Unlock()
		return
	}
	if idle := time.Since(c.idleSince); idle < c.idleTimeout {
		c.idleArmed = true
		c.idleTimer.Reset(c.idleTimeout - idle)
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true // no new streams from here on
	c.mu.Unlock()
	c.shutdown(errIdle, true, http2.ErrCodeNo, "", true)
}
