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
	// the streams it wakes are told which loop calls them (localWaker).
	owner() Owner
}

// driverRef boxes a driver for conn.drv.
type driverRef struct{ d driver }

// driver returns the connection's driver. It is settled before the
// connection starts (startDriver); it is atomic because a Server's
// Shutdown may reach the connection while Config.Drive decides.
func (c *conn) driver() driver { return c.drv.Load().d }

// startDriver settles the connection's driver and arms its keepalive. The
// connection is offered to Config.Drive when its transport has the
// non-blocking face (loopTransport); a loop that takes it drives it from
// then on and startDriver returns nil. Else it returns the goroutine
// driver newConn installed, for the caller to start.
func (c *conn) startDriver() *goDriver {
	g := c.driver().(*goDriver) // newConn's
	if lt, ok := c.nc.(loopTransport); ok && c.cfg.Drive != nil {
		l := &loopDriver{c: c, lt: lt}
		// Installed before Drive: the loop may call l at once.
		c.drv.Store(&driverRef{l})
		if o, ok := c.cfg.Drive(c.nc, l); ok && o != nil {
			l.started(o)
			g = nil
		} else {
			c.drv.Store(&driverRef{g})
			l.refused(g)
		}
	}
	c.mu.Lock()
	c.startKeepaliveLocked()
	c.mu.Unlock()
	return g
}

// commitLocked stores the appended buffer and tells the driver. c.wmu held.
func (c *conn) commitLocked(b []byte) {
	c.pending.b = b
	c.driver().committedLocked()
}

// wakeRead wakes s from the read path: a localWaker is told which loop
// calls it when the loop driver runs the read path.
func (c *conn) wakeRead(s *Stream) {
	s.wakeFrom(c.driver().owner())
}

// Owner returns the event loop's handle of the stream's connection (what
// Config.Drive returned), nil when goroutines drive the connection.
func (s *Stream) Owner() Owner {
	return s.c.driver().owner()
}

var (
	_ driver = (*goDriver)(nil)
	_ driver = (*loopDriver)(nil)
	_ Driven = (*loopDriver)(nil)
)
