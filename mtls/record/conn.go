package record

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Record layer limits (RFC 8446 section 5).
const (
	headerLen     = 5
	maxPlaintext  = 1 << 14                   // content bytes in one record
	maxCiphertext = maxPlaintext + 256        // the largest TLSCiphertext.length accepted
	maxRecord     = headerLen + maxCiphertext // the largest record on the wire
	tagLen        = 16                        // AES-GCM
	// sealedLen is the wire size of a record carrying maxPlaintext bytes:
	// the content, its type byte and the tag.
	sealedLen = headerLen + maxPlaintext + 1 + tagLen
)

// Content types (RFC 8446 section 5.1).
const (
	typeChangeCipherSpec = 20
	typeAlert            = 21
	typeHandshake        = 22
	typeApplicationData  = 23
)

// closeAlertTimeout bounds what Close spends on the alert it owes the peer
// (close_notify, or the fatal alert of a failed Read): a Write in progress
// has that long to finish, then the alert that long to reach the socket. A
// socket with room takes the alert at once; only a peer that stopped
// reading makes Close wait, and it must not hold the closing goroutine
// long for that (crypto/tls gives it five seconds). A variable so that
// tests can change it.
var closeAlertTimeout = 250 * time.Millisecond

// Conn is a TLS 1.3 connection: crypto/tls runs the handshake, the record
// layer of this package protects the application data. Like a *tls.Conn it
// supports one Read and one Write at a time, concurrently with each other;
// Close may be called at any time.
type Conn struct {
	raw      net.Conn
	rc       syscall.RawConn // raw's, when it has one: reads then wait for bytes without a buffer
	tc       *tls.Conn
	isClient bool
	keys     *keyLog
	// ticketsOff reports, on the server side, whether the config of the
	// handshake (after GetConfigForClient) disables session tickets: a
	// ticket would be a record crypto/tls sends with the application keys,
	// so our sequence numbers would not start at zero.
	ticketsOff bool
	// forceFallback makes the connection keep crypto/tls's record layer
	// whatever was negotiated (tests).
	forceFallback bool

	hsMu   sync.Mutex // serializes handshakes; guards hsErr
	hsErr  error
	hsDone atomic.Bool // the handshake completed and the record layer is chosen
	// fallback reports that crypto/tls keeps the data (set before hsDone).
	fallback bool

	closed atomic.Bool
	// fdMode reports that UseFD handed the connection a descriptor: socket
	// I/O is then non-blocking system calls on fd, by the Try methods only
	// (set with rmu and wmu held, never cleared).
	fdMode atomic.Bool
	fd     int

	// pendingKeyUpdate asks the writer to send a KeyUpdate (peer requested
	// one) before its next application data.
	pendingKeyUpdate atomic.Bool
	// pendingAlert is 1 + the fatal alert the reader failed with, for the
	// writer or Close to send.
	pendingAlert atomic.Uint32

	rmu sync.Mutex // one Read at a time; guards the following fields
	in  direction
	rb  *[]byte // raw bytes from the socket (pooled); nil while empty
	r   int     // start of the unprocessed bytes in rb
	w   int     // end of the bytes in rb
	// hsLeft is, during the handshake, how many bytes of the current
	// record crypto/tls may still read.
	hsLeft int
	// plain is decrypted content not yet returned: a view into rb.
	plain []byte
	// hsMsg accumulates post-handshake messages split across records.
	hsMsg []byte
	// idle counts consecutive records that carried no data.
	idle int
	rerr error // sticky read error
	// drained reports, in fd mode, that the last socket read returned
	// less than it asked for (or nothing).
	drained bool
	// readNowFn and rnow carry fillEmptyLocked's read through
	// syscall.RawConn without allocating.
	readNowFn func(fd uintptr) bool
	rnow      nowRead

	wmu             sync.Mutex // one Write at a time; guards the following fields
	out             direction
	werr            error // sticky write error
	closeNotifySent bool
	// backlog holds sealed records a TryWrite could not put on the socket
	// (unsent is the part still to go, a view into *backlog): every later
	// write sends them first, so records leave in sequence order.
	backlog *[]byte
	unsent  []byte
	// writeNowFn and now carry a TryWrite's non-blocking attempt through
	// syscall.RawConn without allocating.
	writeNowFn func(fd uintptr) bool
	now        nowWrite
}

// Client returns a client-side connection over raw, like tls.Client. cfg is
// cloned; the caller may reuse it.
func Client(raw net.Conn, cfg *tls.Config) *Conn {
	c := &Conn{raw: raw, rc: rawConnOf(raw), isClient: true, keys: &keyLog{}}
	cl := cloneConfig(cfg)
	c.keys.next = cl.KeyLogWriter
	cl.KeyLogWriter = c.keys
	c.tc = tls.Client(&handshakeConn{Conn: raw, c: c}, cl)
	return c
}

// Server returns a server-side connection over raw, like tls.Server. cfg is
// cloned; the caller may reuse it. When cfg.GetConfigForClient is set, the
// config it returns is cloned too, so that every handshake logs its secrets
// to this connection only. The record layer is used only when the config of
// the handshake disables session tickets.
func Server(raw net.Conn, cfg *tls.Config) *Conn {
	c := &Conn{raw: raw, rc: rawConnOf(raw), keys: &keyLog{}}
	cl := cloneConfig(cfg)
	c.keys.next = cl.KeyLogWriter
	cl.KeyLogWriter = c.keys
	c.ticketsOff = cl.SessionTicketsDisabled
	if get := cl.GetConfigForClient; get != nil {
		cl.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			got, err := get(hi)
			if err != nil || got == nil {
				return got, err
			}
			got = got.Clone()
			c.keys.next = got.KeyLogWriter
			got.KeyLogWriter = c.keys
			c.ticketsOff = got.SessionTicketsDisabled
			return got, nil
		}
	}
	c.tc = tls.Server(&handshakeConn{Conn: raw, c: c}, cl)
	return c
}

// rawConnOf returns raw's syscall.RawConn, or nil.
func rawConnOf(raw net.Conn) syscall.RawConn {
	if sc, ok := raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			return rc
		}
	}
	return nil
}

func cloneConfig(cfg *tls.Config) *tls.Config {
	if cfg == nil {
		return &tls.Config{}
	}
	return cfg.Clone()
}

// Handshake runs the handshake with no context; see HandshakeContext.
func (c *Conn) Handshake() error { return c.HandshakeContext(context.Background()) }

// HandshakeContext runs crypto/tls's handshake if it has not run yet, then
// takes over the application data when it can. Read and Write call it
// implicitly. A failed handshake fails every later call with the same error.
func (c *Conn) HandshakeContext(ctx context.Context) error {
	if c.hsDone.Load() {
		return nil
	}
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if c.hsDone.Load() {
		return nil
	}
	if c.hsErr != nil {
		return c.hsErr
	}
	c.hsErr = c.handshake(ctx)
	if c.hsErr == nil {
		c.hsDone.Store(true)
	}
	return c.hsErr
}

func (c *Conn) handshake(ctx context.Context) error {
	if err := c.tc.HandshakeContext(ctx); err != nil {
		return err
	}
	defer c.keys.forget()
	st := c.tc.ConnectionState()
	s, ok := suiteByID(st.CipherSuite)
	if c.forceFallback || !ok || st.Version != tls.VersionTLS13 ||
		len(c.keys.client) == 0 || len(c.keys.server) == 0 || (!c.isClient && !c.ticketsOff) {
		c.fallback = true
		return nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.hsLeft != 0 {
		// crypto/tls stopped inside a record: it cannot have, as it reads
		// whole records, but our sequence numbers would then be wrong.
		return errors.New("record: handshake ended inside a record")
	}
	readSecret, writeSecret := c.keys.server, c.keys.client
	if !c.isClient {
		readSecret, writeSecret = writeSecret, readSecret
	}
	// The directions take ownership of the secrets (keys.forget must not
	// zero them).
	c.keys.client, c.keys.server = nil, nil
	if err := c.in.setSecret(s, readSecret); err != nil {
		return err
	}
	if err := c.out.setSecret(s, writeSecret); err != nil {
		return err
	}
	return nil
}

// ConnectionState returns crypto/tls's state of the connection.
func (c *Conn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.raw }

// LocalAddr returns the underlying connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// RemoteAddr returns the underlying connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline sets the underlying connection's deadlines. A Write that
// times out may have sent part of a record, so it fails the write side for
// good; a Read that times out can be retried.
func (c *Conn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// SetReadDeadline sets the underlying connection's read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// SetWriteDeadline sets the underlying connection's write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }

// ownRecords reports whether the handshake is done and this package
// protects the data. It runs the handshake if needed.
func (c *Conn) ownRecords() (bool, error) {
	if !c.hsDone.Load() {
		if err := c.HandshakeContext(context.Background()); err != nil {
			return false, err
		}
	}
	return !c.fallback, nil
}

// Close sends close_notify (RFC 8446 section 6.1), or the fatal alert a
// failed Read owes the peer (section 6.2), and closes the underlying
// connection, whoever ended the connection first and however it ended. It
// is bounded by closeAlertTimeout: a Write in progress has that long to
// finish (its records are on the wire before the alert), and the alert
// that long to be written; past it the connection closes without them. A
// Write that already failed, or left part of a record on the wire, leaves
// nothing the peer could authenticate, so then Close sends nothing.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	if c.fdMode.Load() {
		c.closeFD()
		return nil
	}
	if !c.hsDone.Load() {
		// A handshake in progress ends when the connection closes.
		return c.raw.Close()
	}
	if c.fallback {
		// crypto/tls sends close_notify with its own five-second deadline;
		// closing the socket under it is what bounds it here.
		t := time.AfterFunc(closeAlertTimeout, func() { _ = c.raw.Close() })
		err := c.tc.Close()
		t.Stop()
		return err
	}
	// The deadline also ends a Write blocked on a peer that does not read,
	// so the lock below is taken within it.
	_ = c.raw.SetWriteDeadline(time.Now().Add(closeAlertTimeout))
	var alertErr error
	c.wmu.Lock()
	if c.werr == nil && !c.closeNotifySent {
		alertErr = c.sendAlertLocked(c.closingAlert())
	}
	c.wmu.Unlock()
	if c.rmu.TryLock() {
		c.releaseReadLocked()
		c.rmu.Unlock()
	}
	if err := c.raw.Close(); err != nil {
		return err
	}
	return alertErr
}

// CloseWrite sends close_notify and, when the underlying connection
// supports it, shuts down its write side; the peer reads io.EOF and may
// still send. It waits for a Write in progress.
func (c *Conn) CloseWrite() error {
	own, err := c.ownRecords()
	if err != nil {
		return err
	}
	if !own {
		if err := c.tc.CloseWrite(); err != nil {
			return err
		}
	} else {
		c.wmu.Lock()
		if c.fdMode.Load() {
			c.wmu.Unlock()
			return ErrFDMode
		}
		if c.closeNotifySent {
			c.wmu.Unlock()
			return errors.New("record: CloseWrite called twice")
		}
		if c.werr != nil {
			err := c.werr
			c.wmu.Unlock()
			return err
		}
		err := c.sendAlertLocked(c.closingAlert())
		c.wmu.Unlock()
		if err != nil {
			return err
		}
	}
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// closingAlert is the alert the connection ends with: close_notify, or the
// fatal alert of a failed Read.
func (c *Conn) closingAlert() alert {
	if a := c.pendingAlert.Load(); a != 0 {
		return alert(a - 1)
	}
	return alertCloseNotify
}

// handshakeConn is what crypto/tls reads and writes during the handshake.
// It hands crypto/tls at most one record per Read, so that crypto/tls never
// holds bytes of a record it must not read: whatever follows the peer's
// last handshake record stays in the Conn's buffer for the record layer.
// Once the record layer has taken over it is no longer read; in fallback
// mode it passes the buffered bytes on, then reads the socket directly.
type handshakeConn struct {
	net.Conn
	c *Conn
}

func (h *handshakeConn) Read(p []byte) (int, error) {
	c := h.c
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	if c.hsDone.Load() {
		// Fallback: crypto/tls reads the data records itself.
		if c.r < c.w {
			n := copy(p, (*c.rb)[c.r:c.w])
			c.r += n
			c.releaseIfEmptyLocked()
			return n, nil
		}
		return c.raw.Read(p)
	}
	if c.hsLeft == 0 {
		// At a record boundary: learn the next record's length.
		for c.w-c.r < headerLen {
			if err := c.fillLocked(headerLen); err != nil {
				if c.r < c.w {
					break // let crypto/tls see the short header and fail
				}
				return 0, err
			}
		}
		if c.w-c.r >= headerLen {
			hdr := (*c.rb)[c.r:]
			c.hsLeft = headerLen + (int(hdr[3])<<8 | int(hdr[4]))
		} else {
			c.hsLeft = c.w - c.r
		}
	}
	if c.r == c.w {
		if err := c.fillLocked(1); err != nil {
			return 0, err
		}
	}
	n := min(len(p), c.hsLeft, c.w-c.r)
	copy(p, (*c.rb)[c.r:c.r+n])
	c.r += n
	c.hsLeft -= n
	c.releaseIfEmptyLocked()
	return n, nil
}

// rawBufSize is the size of the pooled socket read buffers: several full
// records, so that a busy connection reads many records per system call
// and rarely moves a partial record to the buffer's front.
const rawBufSize = 128 << 10

var rawBufs = sync.Pool{New: func() any {
	b := make([]byte, rawBufSize)
	return &b
}}

// fillLocked reads the socket once, into the buffer's free tail, after
// making room for need bytes from c.r on (need is at most maxRecord).
func (c *Conn) fillLocked(need int) error {
	fdMode := c.fdMode.Load()
	if c.rb == nil {
		if c.rc != nil && !fdMode {
			return c.fillEmptyLocked()
		}
		c.rb = rawBufs.Get().(*[]byte)
		c.r, c.w = 0, 0
	}
	buf := *c.rb
	if c.r == c.w {
		c.r, c.w = 0, 0
	} else if len(buf)-c.r < need || len(buf)-c.w < maxRecord && c.r > 0 {
		// Move the partial record to the front only when the tail cannot
		// take the rest of it, or a whole record no longer fits.
		c.w = copy(buf, buf[c.r:c.w])
		c.r = 0
	}
	if fdMode {
		return c.readFDLocked(buf)
	}
	n, err := c.raw.Read(buf[c.w:])
	c.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("record: read returned no bytes")
	}
	c.releaseIfEmptyLocked()
	return err
}

// fillEmptyLocked is fillLocked with no buffer: it takes one only once the
// socket has bytes, and waits without one (in the runtime's poller, with
// the read deadline), so a reader blocked on an idle connection — an HBONE
// connection's reader goroutine, always — holds no buffer.
func (c *Conn) fillEmptyLocked() error {
	if c.readNowFn == nil {
		c.readNowFn = c.readNow // one closure per connection, not per read
	}
	c.rnow = nowRead{}
	err := c.rc.Read(c.readNowFn)
	n, rerr := c.rnow.n, c.rnow.err
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return os.NewSyscallError("read", rerr)
	case n == 0:
		return io.EOF
	}
	return nil
}

// nowRead is the result of fillEmptyLocked's read.
type nowRead struct {
	n   int
	err error
}

// readNow is the syscall.RawConn callback of fillEmptyLocked. c.rmu held.
func (c *Conn) readNow(fd uintptr) bool {
	b := rawBufs.Get().(*[]byte)
	var n int
	var err error
	for {
		n, err = syscall.Read(int(fd), *b)
		if err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EAGAIN {
		rawBufs.Put(b)
		return false // wait until readable
	}
	if n > 0 {
		c.rb, c.r, c.w = b, 0, n
	} else {
		rawBufs.Put(b)
	}
	c.rnow = nowRead{n: n, err: err}
	return true
}

// releaseIfEmptyLocked gives the read buffer back when it holds nothing, so
// an idle connection pins none.
func (c *Conn) releaseIfEmptyLocked() {
	if c.rb != nil && c.r == c.w && len(c.plain) == 0 {
		c.releaseReadLocked()
	}
}

func (c *Conn) releaseReadLocked() {
	if c.rb == nil {
		return
	}
	rawBufs.Put(c.rb)
	c.rb, c.r, c.w, c.plain = nil, 0, 0, nil
}
