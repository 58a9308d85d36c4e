package hbone

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// loopConn is a plaintext TCP transport with mtls/record's fd-mode face:
// before UseFD it is the *net.TCPConn; after, Read and Write refuse and
// the Try methods do non-blocking system calls on the descriptor, holding
// what the socket refuses (up to loopConnHold bytes) for TryFlush.
type loopConn struct {
	*net.TCPConn
	fdMode atomic.Bool

	mu      sync.Mutex
	fd      int
	drained bool
	rerr    error
	werr    error
	closed  bool
	unsent  []byte
}

const loopConnHold = 512 << 10

var (
	errLoopWouldBlock = errors.New("loopConn: would block")
	errLoopFDMode     = errors.New("loopConn: blocking call in fd mode")
	errLoopShutdown   = errors.New("loopConn: write side closed")
)

func newLoopConn(tc *net.TCPConn) *loopConn { return &loopConn{TCPConn: tc, fd: -1} }

// NetConn returns the TCP connection (for drive).
func (c *loopConn) NetConn() net.Conn { return c.TCPConn }

// UseFD switches to fd mode on fd.
func (c *loopConn) UseFD(fd int) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		return err
	}
	c.mu.Lock()
	c.fd = fd
	c.mu.Unlock()
	c.fdMode.Store(true)
	return nil
}

func (c *loopConn) Read(p []byte) (int, error) {
	if c.fdMode.Load() {
		return 0, errLoopFDMode
	}
	return c.TCPConn.Read(p)
}

func (c *loopConn) Write(p []byte) (int, error) {
	if c.fdMode.Load() {
		return 0, errLoopFDMode
	}
	return c.TCPConn.Write(p)
}

// Close in fd mode leaves the descriptor to the loop.
func (c *loopConn) Close() error {
	if c.fdMode.Load() {
		c.mu.Lock()
		c.closed = true
		c.unsent = nil
		c.mu.Unlock()
		return nil
	}
	return c.TCPConn.Close()
}

func (c *loopConn) SetDeadline(t time.Time) error {
	if c.fdMode.Load() {
		return nil
	}
	return c.TCPConn.SetDeadline(t)
}

func (c *loopConn) SetWriteDeadline(t time.Time) error {
	if c.fdMode.Load() {
		return nil
	}
	return c.TCPConn.SetWriteDeadline(t)
}

func (c *loopConn) SetReadDeadline(t time.Time) error {
	if c.fdMode.Load() {
		return nil
	}
	return c.TCPConn.SetReadDeadline(t)
}

func (c *loopConn) TryRead(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.fdMode.Load() || c.closed:
		return 0, net.ErrClosed
	case c.rerr != nil:
		return 0, c.rerr
	case len(p) == 0:
		return 0, nil
	}
	for {
		n, err := unix.Read(c.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			c.drained = true
			return 0, errLoopWouldBlock
		case err != nil:
			c.rerr = os.NewSyscallError("read", err)
			return 0, c.rerr
		case n == 0:
			c.rerr = io.EOF
			return 0, io.EOF
		}
		c.drained = n < len(p)
		return n, nil
	}
}

func (c *loopConn) Drained() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fdMode.Load() && !c.closed && c.rerr == nil && c.drained
}

// writeLocked writes p until the socket is full.
func (c *loopConn) writeLocked(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := unix.Write(c.fd, p[n:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return n, nil
		case err != nil:
			c.werr = os.NewSyscallError("write", err)
			c.unsent = nil
			return n, c.werr
		}
		n += k
	}
	return n, nil
}

func (c *loopConn) sendHeldLocked() error {
	n, err := c.writeLocked(c.unsent)
	if err != nil {
		return err
	}
	c.unsent = c.unsent[n:]
	if len(c.unsent) == 0 {
		c.unsent = nil
	}
	return nil
}

func (c *loopConn) TryWriteLent(p []byte) (ok, queued bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.fdMode.Load() || c.closed:
		return true, false, net.ErrClosed
	case c.werr != nil:
		return true, false, c.werr
	}
	if c.unsent != nil {
		if err := c.sendHeldLocked(); err != nil {
			return true, false, err
		}
		if c.unsent != nil {
			if len(c.unsent)+len(p) > loopConnHold {
				return false, true, nil
			}
			c.unsent = append(c.unsent, p...)
			return true, true, nil
		}
	}
	n, err := c.writeLocked(p)
	if err != nil {
		return true, false, err
	}
	if n < len(p) {
		c.unsent = append([]byte(nil), p[n:]...)
	}
	return true, c.unsent != nil, nil
}

func (c *loopConn) TryFlush() (done bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fdMode.Load() || c.closed {
		return true, net.ErrClosed
	}
	if c.unsent == nil {
		return true, nil
	}
	if err := c.sendHeldLocked(); err != nil {
		return true, err
	}
	return c.unsent == nil, nil
}

// TryClose: plaintext has no last words; what is held still goes first.
func (c *loopConn) TryClose() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fdMode.Load() || c.closed {
		return true
	}
	if c.werr == nil {
		if c.unsent != nil {
			_ = c.sendHeldLocked()
		}
		if c.werr == nil {
			c.werr = errLoopShutdown
		}
	}
	return c.unsent == nil
}
