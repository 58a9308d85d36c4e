package hbone

// The driver seam. A connection's protocol (the pump, the stream table,
// the write buffer, shutdown) is its *conn's, written once; who does its
// socket I/O, and when, is its driver's:
//
//   - the goroutine driver (driver_goroutines.go): a reader goroutine
//     making one blocking Read per fill and a writer goroutine making one
//     Write per batch;
//   - the loop driver (driver_loop.go): an event loop's callbacks
//     (Config.Drive, Driven), reading and writing without blocking on the
//     loop's goroutine.
//
// Both read into c.in through readRoom and run step over it; both take the
// committed frames through takePendingLocked and give the buffer back
// through recycleLocked. What differs is behind driver.
type driver interface {
	// committedLocked is told that frames were appended to c.pending, so
	// that they get written. c.wmu held.
	committedLocked()
	// close ends the transport: abrupt, at once, dropping what is not yet
	// written; else once the write buffer (GOAWAY last) is flushed. It may
	// be called again, from any goroutine; an abrupt close cuts a graceful
	// one short.
	close(abrupt bool)
	// owner is the event loop's handle of a loop-driven connection, nil
	// for goroutines. The read path runs inside the loop's callbacks, so
	// the streams it wakes go through the owner (Owner.WakeLocal).
	owner() Owner
}

// takeDriver settles the connection's driver, before the connection is
// published (registered with its Server or returned to its Pool): the
// connection is offered to Config.Drive when its transport has the
// non-blocking face (loopTransport). A loop that takes it returns its
// handle, not yet started, which becomes the loop driver's owner; else
// newConn's goroutine driver stays. Nothing runs yet: startDriver starts
// it.
func (c *conn) takeDriver() {
	lt, ok := c.nc.(loopTransport)
	if !ok || c.cfg.Drive == nil {
		return
	}
	l := &loopDriver{c: c, lt: lt, flushAsked: true}
	if o, ok := c.cfg.Drive(c.nc, l); ok && o != nil {
		l.own = o
		c.drv = l
	}
}

// startDriver arms the connection's keepalive and starts its driver: the
// loop's handle (the loop then reads, and flushes what newConn queued), or
// the goroutine driver's writer, returned for the caller to run its
// readLoop (nil for a loop driver).
func (c *conn) startDriver() *goDriver {
	c.mu.Lock()
	c.startKeepaliveLocked()
	c.mu.Unlock()
	if l, ok := c.drv.(*loopDriver); ok {
		l.own.Start()
		return nil
	}
	g := c.drv.(*goDriver)
	g.start()
	return g
}

// commitLocked stores the appended buffer and tells the driver. c.wmu held.
func (c *conn) commitLocked(b []byte) {
	c.pending.b = b
	c.drv.committedLocked()
}

// wakeRead wakes s from the read path: through the loop's Owner when the
// loop driver runs the read path.
func (c *conn) wakeRead(s *Stream) {
	s.wakeOn(c.drv.owner())
}

// Owner returns the event loop's handle of the stream's connection (what
// Config.Drive returned), nil when goroutines drive the connection.
func (s *Stream) Owner() Owner {
	return s.c.drv.owner()
}

var (
	_ driver = (*goDriver)(nil)
	_ driver = (*loopDriver)(nil)
	_ Driven = (*loopDriver)(nil)
)

// abandon ends a connection refused before it started (a Server shutting
// down, Admit's refusal): the goroutine driver's transport is closed
// without a read; a loop's handle is started only to end the connection
// (a Close asked before Start ends it without a read turn).
func (c *conn) abandon(cause error) {
	if l, ok := c.drv.(*loopDriver); ok {
		c.forceClose(cause)
		l.own.Start()
		return
	}
	c.cancel()
	_ = c.nc.Close()
}
