package engine

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// This file is the contract of a loop-owned connection (step 4 of
// docs/design/hbone-loop.md): a multiplexed connection (a pooled HBONE
// connection) whose socket an epoll stream loop owns, so that the
// connection's reads, writes and the relays of its streams all run on one
// goroutine. The engine does readiness, placement, flushing and the
// socket's close; the driver (hbone, through the proxy) does the protocol
// and every byte of I/O on the descriptor it is given.
//
// Who sends what on close: the driver writes its own bytes (GOAWAY,
// close_notify or the alert it owes) in Flush and Writable; the engine
// never writes to the socket. Once the driver holds nothing more, the
// engine sends the FIN (shutdown SHUT_WR), reads and discards until the
// peer's EOF for at most connLinger (so unread input does not turn the
// close into a reset that could destroy the driver's last bytes at the
// peer), then closes the descriptor. Close(true), a failed write and a
// flush that outlasts its bound close at once with SO_LINGER 0 (RST).

// ErrUnsupported is StartConn's answer on a backend that cannot own
// connections (std, uring): the caller keeps the connection and drives it
// with goroutines. It matches errors.ErrUnsupported.
var ErrUnsupported = fmt.Errorf("engine: loop-owned connections need the epoll backend: %w", errors.ErrUnsupported)

// ConnDriver is the protocol side of a loop-owned connection. Every method
// is called on the connection's loop goroutine, one at a time, and must
// not block: a call that does stalls every connection and relay of the
// loop (Stats.ConnStalls counts calls over 1 ms). The descriptor is
// non-blocking; the driver reads and writes it with plain syscalls and
// never closes it.
type ConnDriver interface {
	// Readable reads what the socket has (until EAGAIN, a short read, or a
	// budget of its own) and processes it. It is called when the socket
	// signals input, once when the connection is added (bytes read before
	// the hand-off may wait in the driver's buffers, with no edge to come)
	// and again after it returned more=true: its budget ran out with input
	// left, and it goes back in line behind the loop's other work, so one
	// busy connection does not starve the others. An error ends the
	// connection as Close(false) does (the driver may have queued a last
	// GOAWAY or alert), with a shorter bound on the flush.
	Readable() (more bool, err error)
	// Writable is called when the socket has room again after the driver
	// held bytes, and on readiness reports that carry room after a Flush
	// (possibly spuriously: with nothing held it returns (false, nil)). It
	// writes what it holds until the socket refuses; more reports that
	// some is still held (it is called again on the next room). An error
	// (a failed write) aborts the connection.
	Writable() (more bool, err error)
	// Flush writes what was committed since the last Flush (one write,
	// holding what the socket refuses for Writable). The loop calls it
	// at the end of an iteration for a connection that was woken (Wake)
	// or whose stream relays ran, at most once per iteration however many
	// commits there were. An error aborts the connection.
	Flush() error
	// Ended is the last call, exactly once: err is nil after a clean
	// close (Close(false) whose bytes went out), ErrAborted after
	// Close(true), ErrClosed when the engine closed, else the error that
	// ended the connection. The descriptor is still open during the call
	// (a last non-blocking write is allowed, e.g. an alert on ErrClosed)
	// and is closed by the engine right after it returns.
	Ended(err error)
}

// Homed is a StreamEndpoint whose stream is carried by a loop-owned
// connection: a relay of it is placed on its connection's loop, so the
// stream's bytes cross no goroutine. Home returns nil for a stream whose
// connection is driven by goroutines (placement is then round-robin).
type Homed interface {
	Home() *ConnHandle
}

// Bounds of a loop-owned connection's close (see the top of this file).
// The loop keeps no clock for its connections: an idle one costs no
// wake-up (a driver's timeouts are its own).
const (
	// connFlushTimeout bounds Close(false)'s flush of the driver's bytes.
	connFlushTimeout = 2 * time.Second
	// connAbruptTimeout bounds the flush after a Readable error.
	connAbruptTimeout = 500 * time.Millisecond
	// connLinger bounds the wait for the peer's EOF after the FIN.
	connLinger = time.Second
	// connStall is the driver call duration Stats.ConnStalls counts.
	connStall = time.Millisecond
)

// errCloseFlush ends a connection whose driver still held bytes when the
// close's flush bound passed.
var errCloseFlush = errors.New("engine: connection close: flush timed out")

// connBackend is a backend that runs loop-owned connections (epoll).
type connBackend interface {
	// takeConn makes the entry of a loop-owned connection on fd, bound
	// already, and picks its loop; Start hands it to that loop.
	takeConn(fd int, d ConnDriver) *ConnHandle
}

// TakeConn takes a connected TCP socket for a loop-owned connection driven
// by d, and returns its handle before any loop can call d, so that the
// driver knows its handle from its first callback: it takes the socket
// away from the runtime's poller (the *net.TCPConn is closed; addresses
// read from it before stay valid), calls bind with the descriptor (the
// driver's I/O goes there from now on: the proxy's tlsConn.UseFD) and
// picks a stream loop. Start hands the connection to that loop, which
// runs d.Readable there once; the caller must call Start exactly once.
// Wake and Close are allowed before Start: what they ask is done once the
// loop has the connection (a Close then ends it without a read turn).
//
// ErrUnsupported (std, uring) leaves tc untouched and the caller's: drive
// it with goroutines. Any other error (the engine closed, the takeover or
// bind failed) closes tc; d is never called when TakeConn fails.
func (e *Engine) TakeConn(tc *net.TCPConn, d ConnDriver, bind func(fd int) error) (*ConnHandle, error) {
	cb, ok := e.backend.(connBackend)
	if !ok {
		return nil, ErrUnsupported
	}
	if !e.beginConn() {
		_ = tc.Close()
		return nil, ErrClosed
	}
	fd, err := e.detach(tc)
	if err != nil {
		resetConn(tc)
		e.connEnded()
		return nil, fmt.Errorf("engine: take over connection: %w", err)
	}
	if bind != nil {
		if err := bind(fd); err != nil {
			abortFD(fd)
			e.connEnded()
			return nil, fmt.Errorf("engine: bind connection: %w", err)
		}
	}
	return cb.takeConn(fd, d), nil
}

// beginConn counts a loop-owned connection in; false means the engine is
// closed.
func (e *Engine) beginConn() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.conns++
	return true
}

// connEnded counts a loop-owned connection out (Drain waits for them as
// for relays).
func (e *Engine) connEnded() {
	e.mu.Lock()
	e.conns--
	e.idleCheckLocked()
	e.mu.Unlock()
}
