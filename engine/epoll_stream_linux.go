package engine

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"unsafe"

	"github.com/ztunnel-go/ztunnel/engine/bufpool"
	"github.com/ztunnel-go/ztunnel/engine/poll"
	"golang.org/x/sys/unix"
)

// Buffer sizes of a TCP⇄stream relay: each direction starts small and
// grows after a read that filled its buffer, as ztunnel's relay grows its
// buffers, so request/response traffic stays in small buffers and bulk
// transfers get large ones. A buffer is held only while it has bytes in
// flight.
var streamBufSizes = [...]int{1 << 10, 16 << 10, 256 << 10}

// maxPeekViews bounds the views of a StreamPeeker one writev sends.
const maxPeekViews = 16

// streamRelay is one TCP⇄stream relay owned by an epoll loop (see
// stream.go for the contract). The TCP socket is registered with the
// loop's poller; the stream tells the loop through Wake (a task on the
// loop's queue, at most one pending) that it may progress.
type streamRelay struct {
	relayBase
	l       *eloop
	s       *session
	fd      int
	st      StreamEndpoint
	pk      StreamPeeker // st, if it lends its buffer (T→S without a copy)
	fl      StreamFiller // st, if the socket may be read into its buffer (S→T without a copy)
	tcpSide int          // the side (0 A, 1 B) the socket is on
	home    *connEntry   // the stream's loop-owned connection, on this loop; nil if none
	up      sdir         // socket → stream
	down    sdir         // stream → socket
	// The flags share a word: an idle relay is one of these, within the
	// 224-byte size class (TestRelaySizeClass).
	flags  atomic.Uint32 // flagWoke, flagDownBusy, flagDirect
	peeked bool          // a Peek awaits its Consume
	rd, wr bool          // the socket's readiness as last learnt
	hup    bool          // the peer's FIN (or an error) was signalled: read until EOF
}

// The bits of streamRelay.flags, which other goroutines read and set.
const (
	// flagWoke: a wake-up task is queued (Wake coalesces).
	flagWoke uint32 = 1 << iota
	// flagDownBusy: the loop holds stream → socket bytes (a relay buffer
	// or a Peek's views), or is taking some: TryDeliver must not write
	// ahead of them.
	flagDownBusy
	// flagDirect: TryDeliver moved bytes since the loop last marked the
	// relay active (the idle timeout counts them as activity).
	flagDirect
)

// sdir is one direction of a streamRelay.
type sdir struct {
	buf    *[]byte // nil unless bytes are in flight
	count  *atomic.Int64
	off, n int   // bytes in flight: (*buf)[off:n]
	class  uint8 // index into streamBufSizes
	eof    bool  // the source ended
	shut   bool  // the destination was told (CloseWrite, SHUT_WR)
}

func (d *sdir) pending() bool { return d.buf != nil && d.off < d.n }

func (d *sdir) take(l *eloop) []byte {
	l.nBufs.Add(1)
	d.buf = bufpool.Get(streamBufSizes[d.class])
	return (*d.buf)[:streamBufSizes[d.class]]
}

func (d *sdir) release(l *eloop) {
	if d.buf != nil {
		l.nBufs.Add(-1)
		bufpool.Put(d.buf)
		d.buf, d.off, d.n = nil, 0, 0
	}
}

// filled notes a read of n bytes into a buffer of the current class and
// grows the class when the read filled it.
func (d *sdir) filled(n int) {
	d.off, d.n = 0, n
	if n == streamBufSizes[d.class] && int(d.class) < len(streamBufSizes)-1 {
		d.class++
	}
}

func (b *epollBackend) relayStream(fd, tcpSide int, st StreamEndpoint, s *session) {
	// A stream of a loop-owned connection goes to its connection's loop:
	// its bytes then cross no goroutine. Placement only: any loop would
	// work through Wake and TryDeliver.
	var home *connEntry
	var l *eloop
	if hm, ok := st.(Homed); ok {
		if h := hm.Home(); h != nil && h.l.b == b {
			home, l = h.entry(), h.l
		}
	}
	if l == nil {
		l = b.strm[b.pick(len(b.strm))]
	}
	r := &streamRelay{l: l, s: s, fd: fd, st: st, tcpSide: tcpSide, home: home}
	if pk, ok := st.(StreamPeeker); ok && !b.e.noPeek {
		r.pk = pk
	}
	if fl, ok := st.(StreamFiller); ok && !b.e.noPeek {
		r.fl = fl
	}
	r.init(r)
	if tcpSide == 0 {
		r.up.count, r.down.count = &s.counters.AToB, &s.counters.BToA
	} else {
		r.up.count, r.down.count = &s.counters.BToA, &s.counters.AToB
	}
	// The waker is set first: a wake-up queued before the relay is added
	// finds it unregistered and is dropped, and add services it anyway.
	st.SetWaker(r)
	if !l.submit(task{op: opAdd, r: r}) {
		r.refuse(ErrClosed)
		return
	}
	s.setOwner(r)
}

// Wake is the stream's signal, from any goroutine: queue one look at the
// relay on its loop.
func (r *streamRelay) Wake() {
	if r.flags.Or(flagWoke)&flagWoke == 0 {
		r.l.submit(task{op: opWake, r: r})
	}
}

// TryDeliver is the stream's direct delivery (see DirectSink in
// stream.go), from the goroutine that received the bytes: when the loop
// holds no stream → socket byte, it writes p to the socket itself with
// one non-blocking write and returns what the socket took, so the loop
// need not be woken for it. 0 (the loop is busy with that direction, the
// socket is full or failed) leaves p to the stream, which buffers it and
// wakes the loop: the loop's own write then meets whatever the socket
// said.
func (r *streamRelay) TryDeliver(p []byte) int {
	if len(p) == 0 || r.flags.Load()&flagDownBusy != 0 {
		return 0
	}
	n, err := unix.Write(r.fd, p)
	if n < len(p) {
		r.l.nDirectShort.Add(1)
	}
	if err != nil || n <= 0 {
		return 0
	}
	r.down.count.Add(int64(n))
	r.l.nDirect.Add(1)
	if r.flags.Load()&flagDirect == 0 {
		r.flags.Or(flagDirect)
	}
	return n
}

// touch marks the relay active for the idle timeout.
func (r *streamRelay) touch() {
	if r.flags.Load()&flagDirect != 0 {
		r.flags.And(^flagDirect)
	}
	r.l.touch(&r.relayBase)
}

// directSinceTouch reports (and forgets) whether TryDeliver moved bytes
// since the loop last marked the relay active.
func (r *streamRelay) directSinceTouch() bool {
	return r.flags.And(^flagDirect)&flagDirect != 0
}

// woken runs the wake-up on the loop.
func (r *streamRelay) woken() {
	r.flags.And(^flagWoke)
	if r.slot >= 0 {
		r.service()
	}
}

func (r *streamRelay) abort(cause error) {
	r.l.submit(task{op: opAbort, r: r, err: cause})
}

func (r *streamRelay) fdOf(side int) int {
	if side == r.tcpSide {
		return r.fd
	}
	return -1
}

func (r *streamRelay) refuse(err error) {
	r.closed = true
	r.st.SetWaker(nil)
	abortFD(r.fd)
	_ = r.st.Abort()
	_ = r.st.Close()
	r.s.finish(err)
}

func (r *streamRelay) event(_ int, ev poll.Event) {
	if ev.Events&poll.Err != 0 {
		if err := sockError(r.fd); err != nil {
			r.end(r.opErr("connection", err), true)
			return
		}
	}
	if ev.Events&(poll.In|poll.RDHup|poll.Hup|poll.Err) != 0 {
		r.rd = true
	}
	if ev.Events&(poll.RDHup|poll.Hup|poll.Err) != 0 {
		r.hup = true
	}
	if ev.Events&(poll.Out|poll.Hup|poll.Err) != 0 {
		r.wr = true
	}
	r.service()
}

func (r *streamRelay) service() {
	if r.closed {
		return
	}
	if h := r.home; h != nil {
		// What the turn commits to the connection (DATA, WINDOW_UPDATE,
		// RST_STREAM) leaves in the connection's Flush at the end of the
		// iteration; its Wakes meanwhile need no task.
		r.l.enter(h)
		r.l.markFlush(h)
		defer r.l.leave(h)
	}
	moreUp, err := r.pumpUp()
	if err != nil {
		r.end(err, true)
		return
	}
	moreDown, err := r.pumpDown()
	if err != nil {
		r.end(err, true)
		return
	}
	if r.up.shut && r.down.shut {
		r.end(nil, false)
		return
	}
	if (moreUp || moreDown) && !r.queued {
		r.queued = true
		r.l.ready = append(r.l.ready, loopRelay(r))
	}
}

// pumpUp moves socket → stream: it reads the socket only while the stream
// can take what it reads, so a shut window leaves the bytes in the socket
// and TCP flow control pushes back on the sender.
func (r *streamRelay) pumpUp() (more bool, err error) {
	if r.fl != nil {
		return r.turn(r.upFill)
	}
	return r.turn(r.upCopy)
}

// turn runs step, one round of a direction, until it moves nothing or
// fails, for at most roundsPerTurn rounds; more reports that the budget ran
// out with work left. Each round that moved bytes marks the relay active.
func (r *streamRelay) turn(step func() (moved bool, err error)) (more bool, err error) {
	for range roundsPerTurn {
		moved, err := step()
		if err != nil || !moved {
			return false, err
		}
		r.touch()
	}
	return true, nil
}

// upCopy is one round of pumpUp through the relay's own buffer.
func (r *streamRelay) upCopy() (moved bool, err error) {
	d := &r.up
	if d.pending() {
		k, err := r.st.TryWrite((*d.buf)[d.off:d.n])
		if err != nil {
			return false, r.streamErr("write", err)
		}
		if k == 0 {
			return false, nil // window shut: the stream owes us a Wake
		}
		d.off += k
		d.count.Add(int64(k))
		moved = true
		if d.off == d.n {
			d.release(r.l)
		}
	}
	// A partial take promises no Wake (the window may have shrunk since
	// WriteWindow, or the stream takes at most so much per call): only
	// a TryWrite that takes nothing does, so try again before waiting.
	if !d.pending() && !d.eof && r.rd {
		w := r.st.WriteWindow()
		if w == 0 {
			if _, err := r.st.TryWrite(nil); err != nil {
				return false, r.streamErr("write", err)
			}
			return false, nil // window shut: wait for Wake
		}
		p := d.take(r.l)
		p = p[:min(w, len(p))]
		n, err := unix.Read(r.fd, p)
		if n > 0 && n < len(p) && !r.hup {
			// A short read drained the socket: with edge-triggered
			// polling, bytes that arrive later bring a new event, so
			// the read that would only say EAGAIN is saved. (After a
			// FIN, read on to see the EOF no new event would bring.)
			r.rd = false
		}
		switch {
		case err == unix.EAGAIN:
			r.rd = false
			d.release(r.l)
		case err != nil:
			d.release(r.l)
			return false, r.opErr("read", err)
		case n == 0:
			d.eof = true
			d.release(r.l)
			moved = true
		default:
			d.filled(n)
			moved = true
		}
	}
	return moved, r.endUp()
}

// upFill is one round of pumpUp for a StreamFiller: the socket is read
// straight into the stream's send buffer, so this direction holds no relay
// buffer and its bytes are not copied on the way.
func (r *streamRelay) upFill() (moved bool, err error) {
	d := &r.up
	if !d.eof && r.rd {
		n, rerr, werr := r.fl.WriteFrom(streamBufSizes[d.class], (*sockReader)(r))
		switch {
		case werr != nil:
			return false, r.streamErr("write", werr)
		case rerr == io.EOF:
			d.eof = true
			moved = true
		case rerr == unix.EAGAIN:
			r.rd = false
		case rerr != nil:
			return false, r.opErr("read", rerr)
		case n == 0:
			return false, nil // window or buffer shut: the stream owes us a Wake
		default:
			if n == streamBufSizes[d.class] && int(d.class) < len(streamBufSizes)-1 {
				d.class++
			}
			d.count.Add(int64(n))
			moved = true
		}
	}
	return moved, r.endUp()
}

// endUp tells the stream that the socket's input ended, once it has all
// of it.
func (r *streamRelay) endUp() error {
	d := &r.up
	if d.eof && !d.pending() && !d.shut {
		d.shut = true
		if err := r.st.CloseWrite(); err != nil {
			return r.streamErr("close write", err)
		}
	}
	return nil
}

// sockReader is the relay's socket as the io.Reader a StreamFiller reads:
// one non-blocking read, io.EOF at the end of the input.
type sockReader streamRelay

func (sr *sockReader) Read(p []byte) (int, error) {
	r := (*streamRelay)(sr)
	n, err := unix.Read(r.fd, p)
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	case n < len(p) && !r.hup:
		r.rd = false // drained: see pumpUp
	}
	return n, nil
}

// pumpDown moves stream → socket: it takes bytes from the stream (which
// returns their window to the peer) only once the previous ones are in the
// socket, so a slow reader slows the peer down.
//
// While it runs, and while it holds bytes for the socket, flagDownBusy
// keeps TryDeliver from writing ahead of them: it is set before the loop
// takes bytes from the stream (under the stream's lock, which TryDeliver
// runs under), so either TryDeliver wrote before them or it sees the flag.
func (r *streamRelay) pumpDown() (more bool, err error) {
	r.flags.Or(flagDownBusy)
	if r.pk != nil {
		more, err = r.pumpDownPeek()
	} else {
		more, err = r.turn(r.downCopy)
	}
	if !r.down.pending() && !r.peeked {
		r.flags.And(^flagDownBusy)
	}
	return more, err
}

// downCopy is one round of pumpDown through the relay's own buffer.
func (r *streamRelay) downCopy() (moved bool, err error) {
	d := &r.down
	if d.pending() && r.wr {
		k, err := unix.Write(r.fd, (*d.buf)[d.off:d.n])
		switch {
		case err == unix.EAGAIN:
			r.wr = false
		case err != nil:
			return false, r.opErr("write", err)
		case k > 0:
			d.off += k
			d.count.Add(int64(k))
			moved = true
		}
		if d.off == d.n {
			d.release(r.l)
		}
	}
	if !d.eof && d.buf == nil {
		p := d.take(r.l)
		n, err := r.st.TryRead(p)
		switch {
		case err == io.EOF:
			d.eof = true
			d.release(r.l)
			moved = true
		case err != nil:
			d.release(r.l)
			return false, r.streamErr("read", err)
		case n == 0:
			d.release(r.l) // nothing buffered: wait for Wake
		default:
			d.filled(n)
			moved = true
		}
	}
	return moved, r.endDown()
}

// endDown shuts the socket's write side once the stream's input ended and
// all of it is in the socket.
func (r *streamRelay) endDown() error {
	d := &r.down
	if d.eof && !d.pending() && !d.shut {
		d.shut = true
		if err := unix.Shutdown(r.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
			return r.opErr("shutdown", err)
		}
	}
	return nil
}

// pumpDownPeek is pumpDown for a StreamPeeker: the socket takes the bytes
// straight from the stream's buffer, and only what it took is consumed.
func (r *streamRelay) pumpDownPeek() (more bool, err error) {
	d := &r.down
	if r.l.iov == nil {
		r.l.iov = make([][]byte, 0, maxPeekViews)
	}
	for range roundsPerTurn {
		if d.eof || !r.wr {
			break
		}
		views, err := r.pk.Peek(r.l.iov[:0])
		switch {
		case err == io.EOF:
			d.eof = true
		case err != nil:
			return false, r.streamErr("read", err)
		case len(views) == 0:
			return false, nil // nothing buffered: wait for Wake
		default:
			r.peeked = true
			k, err := writev(r.fd, views)
			clear(views)
			if err == unix.EAGAIN {
				r.wr = false // the view stays lent until the socket drains
				return false, nil
			}
			if err != nil {
				return false, r.opErr("write", err)
			}
			r.pk.Consume(k)
			r.peeked = false
			d.count.Add(int64(k))
			r.touch()
			continue
		}
		break
	}
	// A peeking direction holds no buffer: nothing is pending at its end.
	return !d.eof && r.wr, r.endDown()
}

// writev writes views with one syscall.
func writev(fd int, views [][]byte) (int, error) {
	if len(views) == 1 {
		return unix.Write(fd, views[0])
	}
	var iov [maxPeekViews]unix.Iovec
	n := 0
	for _, v := range views {
		if len(v) > 0 {
			iov[n].Base = &v[0]
			iov[n].SetLen(len(v))
			n++
		}
	}
	for {
		k, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		switch errno {
		case 0:
			return int(k), nil
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}

// end closes the socket and the stream (resetting both if abort), returns
// the buffers and reports the result.
func (r *streamRelay) end(err error, abort bool) {
	if r.closed || r.slot < 0 {
		return
	}
	r.closed = true
	r.up.release(r.l)
	r.down.release(r.l)
	if r.peeked {
		r.pk.Consume(0) // end the view, so the stream can free its buffer
	}
	r.st.SetWaker(nil)
	if abort {
		abortFD(r.fd)
		_ = r.st.Abort()
	} else {
		_ = unix.Close(r.fd)
	}
	_ = r.st.Close()
	r.l.release(&r.relayBase)
	r.s.finish(err)
}

func (r *streamRelay) opErr(op string, err error) error {
	return fmt.Errorf("engine: %s %s: %w", op, sideName[r.tcpSide], err)
}

func (r *streamRelay) streamErr(op string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("engine: stream %s %s: %w", op, sideName[1-r.tcpSide], err)
}

var _ DirectSink = (*streamRelay)(nil)
