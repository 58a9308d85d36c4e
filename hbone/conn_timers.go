package hbone

import (
	"time"

	"golang.org/x/net/http2"
)

// The connection's timers: the keepalive PING (every Config.PingInterval,
// closing the connection when one stays unacknowledged for PingTimeout) and
// a pooled connection's idle timer. Both run as time.AfterFunc callbacks
// that take c.mu, so they need no goroutine of their own.

// startKeepaliveLocked starts the keepalive clock of a connection that
// starts running. c.mu held.
func (c *conn) startKeepaliveLocked() {
	c.pingSent = time.Now()
	if c.cfg.PingInterval > 0 {
		c.pingTimer = time.AfterFunc(c.cfg.PingInterval, c.onPingTimer)
	}
}

// stopTimersLocked stops both timers of a connection that ends. c.mu held.
func (c *conn) stopTimersLocked() {
	if c.pingTimer != nil {
		c.pingTimer.Stop()
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
}

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

// startIdleLocked starts the idle clock of a pooled connection whose last
// stream or reservation just ended; the timer is armed once and re-checks
// idleSince when it fires, so a busy connection does not reset it per
// stream. c.mu held.
func (c *conn) startIdleLocked() {
	if c.idleTimeout <= 0 {
		return
	}
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
