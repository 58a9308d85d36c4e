package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A connection's code is split by role over conn*.go and read.go (the
// package doc's code map): this file holds its fields, construction,
// lifecycle and close.

const (
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
)

// conn is one HTTP/2 connection, client or server side. Its driver
// (driver.go) does the socket I/O: it feeds the read pump (pump.go), which
// owns the framer and the receive path, from one goroutine at a time (the
// reader goroutine or the event loop), and it writes what streams and the
// read path append to a shared write buffer under wmu.
//
// Lock order: mu before wmu, mu before Stream.mu. Stream.mu and wmu are
// leaves: nothing is locked while holding them.
type conn struct {
	nc     net.Conn
	cfg    Config
	client bool
	logf   func(format string, args ...any)
	drv    driver // settled before the connection is published (takeDriver)

	// The read path only, run by the driver (read.go, pump.go).
	in          readBuf // received plaintext the pump has yet to process
	state       pumpState
	fh          http2.FrameHeader // stFrame: the frame whose payload is awaited
	scan        blockScan         // stFrame on HEADERS: how much of the block is checked
	data        dataState         // stData: the DATA frame in progress
	src         frameSrc          // the framer reads through it
	fr          *http2.Framer
	gotSettings bool
	resetTokens float64   // server: streams the peer may still waste (see Config.MaxResetStreams)
	resetStamp  time.Time // when resetTokens was last refilled

	// Receive-side connection flow control (conn_flow.go). Atomic because
	// stream readers return credit from their own goroutines.
	recvConnAvail      atomic.Int64 // bytes the peer may still send
	connUnacked        atomic.Int64 // consumed bytes not yet returned by WINDOW_UPDATE
	streamAckThreshold int64
	connAckThreshold   int64

	mu sync.Mutex // guards the following fields
	// The stream table (conn_streams.go) and the connection's state.
	streams    map[uint32]*Stream
	active     int            // open streams (counted against the stream limit)
	reserved   int            // stream slots promised to pending Connects
	nextID     uint32         // client: next stream ID to open
	maxPeerID  uint32         // server: highest stream ID the peer opened
	hist       *streamHistory // server: how recent streams closed (history.go)
	closed     bool
	closeErr   error
	goAwaySent bool
	goAwayRecv bool
	goAwayErr  *GoAwayError
	drainNow   bool // set under mu; unlock() then closes the connection
	// Send-side flow control and the peer's settings (conn_flow.go, read.go).
	sendWindow        int64
	connWinCond       sync.Cond // writers waiting for connection send window
	connWinWaiters    int
	peerInitialWindow int64
	peerMaxStreams    uint32
	peerMaxHeaderList uint32
	// Timers (conn_timers.go).
	pingOut     bool
	pingSent    time.Time
	pingData    [8]byte
	pingSeq     uint64
	pingTimer   *time.Timer
	idleTimeout time.Duration
	idleSince   time.Time
	idleTimer   *time.Timer
	idleArmed   bool
	onClose     func()

	// The write path (conn_write.go).
	wmu           sync.Mutex // guards the following fields
	pending       *frameBuf  // frames queued for the writer; nil when empty and idle
	spare         *frameBuf  // the buffer the writer last flushed, for reuse
	wclosing      bool       // no more frames; the writer flushes and exits
	wErr          error      // what appenders get once wclosing
	bufCond       sync.Cond  // streams waiting for write-buffer space
	bufWaiters    int
	wPeerMaxFrame int
	enc           *hpack.Encoder
	hbuf          bytes.Buffer
	poll          pollWaiters // event-loop streams waiting for window or buffer room

	exits atomic.Int32  // reader, writer and shutdown, when finished
	done  chan struct{} // closed when all three are

	// Server side.
	srv    *Server
	ctx    context.Context
	vals   context.Context // ctx's values without its cancellation, for handler contexts
	cancel context.CancelFunc
	// holds counts what the connection's end waits for before served
	// runs: the connection itself (until done closes) and each handler.
	holds  atomic.Int64
	served func() // Server.Start's end of the connection; set before it starts
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
		done:               make(chan struct{}),
	}
	c.holds.Store(1)       // the connection's own, released when done closes
	c.drv = newGoDriver(c) // unless takeDriver gives the connection to a loop
	if client {
		c.state = stHeader
	}
	c.src.left = -1
	c.fr = http2.NewFramer(io.Discard, &c.src)
	c.fr.SetMaxReadFrameSize(cfg.MaxFrameSize)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = cfg.MaxHeaderListSize
	c.recvConnAvail.Store(int64(cfg.ConnWindow))
	c.resetTokens = float64(cfg.MaxResetStreams)
	c.connWinCond.L = &c.mu
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

// exit is called once when the driver's read side is done, once when its
// write side is (the goroutine driver's reader and writer; the loop
// driver's Ended counts both) and once by the shutdown that ended the
// connection; the last one closes done, so Done implies that teardown
// (including the onClose hook) has completed.
func (c *conn) exit() {
	if c.exits.Add(1) == 3 {
		close(c.done)
		c.release()
	}
}

// release drops a hold on the connection's end (holds); the last runs
// served: the connection has ended and its handlers have returned. No
// handler starts once done is closed (the read path that starts them has
// exited).
func (c *conn) release() {
	if c.holds.Add(-1) == 0 && c.served != nil {
		c.served()
	}
}

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
	c.stopTimersLocked()
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
	c.bufCond.Broadcast()
	c.wmu.Unlock()
	onClose := c.onClose
	c.mu.Unlock()

	for _, s := range streams {
		s.endRecv(serr)
	}
	c.drv.close(!goAway && !graceful)
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
	c.drv.close(true)
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
