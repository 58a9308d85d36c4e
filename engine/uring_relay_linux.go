package engine

import (
	"fmt"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/engine/splice"
	"github.com/ztunnel-go/ztunnel/engine/uring"
	"golang.org/x/sys/unix"
)

// uRelay is one TCP⇄TCP relay owned by an io_uring loop. Side 0 is A,
// side 1 is B; direction d moves bytes from side d to side 1-d.
type uRelay struct {
	l    *uloop
	s    *session
	fd   [2]int
	slot int32
	gen  uint32

	// rd and wr are the sockets' readiness as last learnt: set by a poll
	// completion, cleared by EAGAIN.
	rd, wr [2]bool
	// pollSeq counts POLLIN completions per side, so an EAGAIN from a
	// splice submitted before the latest one does not clear readiness
	// that arrived meanwhile.
	pollSeq  [2]uint32
	inArmed  [2]bool // multishot POLLIN armed
	outArmed [2]bool // one-shot POLLOUT armed
	dir      [2]udir
	inflight int // requests whose completion has not arrived

	closing bool
	err     error

	idleLinks[*uRelay] // l.idle
}

func (r *uRelay) links() *idleLinks[*uRelay] { return &r.idleLinks }

// udir is one way of a uRelay.
type udir struct {
	pipe    *splice.Pipe
	count   *atomic.Int64
	chain   int    // splices in flight (0, 1 or 2)
	seqAtIn uint32 // the source's pollSeq when the splice-in was submitted
	eof     bool
	shut    bool
}

// abort is Handle.Abort's way in.
func (r *uRelay) abort(cause error) {
	r.l.submit(utask{op: opAbort, r: r, err: cause})
}

func (r *uRelay) ud(kind uint8) uint64 { return userData(kind, r.slot, r.gen) }

func (r *uRelay) armIn(side int) {
	r.l.sqe().PrepPollAdd(r.fd[side], unix.POLLIN|unix.POLLRDHUP, true, r.ud(kPollIn+uint8(side)))
	r.inArmed[side] = true
	r.inflight++
}

func (r *uRelay) armOut(side int) {
	if r.outArmed[side] {
		return
	}
	r.l.sqe().PrepPollAdd(r.fd[side], unix.POLLOUT, false, r.ud(kPollOut+uint8(side)))
	r.outArmed[side] = true
	r.inflight++
}

// complete handles one completion of this relay.
func (r *uRelay) complete(kind uint8, c *uring.CQE) {
	if kind >= kSpliceIn {
		r.spliced(kind, c)
	} else {
		r.polled(kind, c)
	}
	if assertions {
		r.check()
	}
	if r.closing && r.inflight == 0 {
		r.finalize()
	}
}

// polled handles a poll completion: a socket's readiness.
func (r *uRelay) polled(kind uint8, c *uring.CQE) {
	in := kind < kPollOut
	side := int(kind - kPollIn)
	if in {
		if !c.More() {
			r.inArmed[side] = false
			r.inflight--
		}
	} else {
		side = int(kind - kPollOut)
		r.outArmed[side] = false
		r.inflight--
	}
	if r.closing {
		return
	}
	if c.Res < 0 {
		r.end(r.opErr("poll", side, c.Err()), true)
		return
	}
	if !in {
		r.wr[side] = true
		r.kick(1 - side)
		return
	}
	if c.Res&unix.POLLERR != 0 {
		if err := sockError(r.fd[side]); err != nil {
			r.end(r.opErr("connection", side, err), true)
			return
		}
	}
	r.rd[side] = true
	r.pollSeq[side]++
	if c.Res&(unix.POLLHUP|unix.POLLERR) != 0 {
		r.wr[side] = true
	}
	if !r.inArmed[side] {
		r.armIn(side)
	}
	r.kick(side)
	r.kick(1 - side)
}

// spliced handles a splice completion: bytes moved into a direction's pipe
// (from its source) or out of it (to its destination).
func (r *uRelay) spliced(kind uint8, c *uring.CQE) {
	out := kind >= kSpliceOut
	d := int(kind - kSpliceIn)
	if out {
		d = int(kind - kSpliceOut)
	}
	dd := &r.dir[d]
	dd.chain--
	r.inflight--
	if r.closing {
		return
	}
	if !out {
		switch {
		case c.Res > 0:
			dd.pipe.Buffered += int(c.Res)
			r.touch()
		case c.Res == 0:
			dd.eof = true
			r.touch()
		case c.Res == -int32(unix.EAGAIN):
			// Empty pipe and no newer poll wake-up: the socket is empty.
			// (A full pipe also says EAGAIN; the bytes in it go out first.)
			if dd.pipe.Buffered == 0 && r.pollSeq[d] == dd.seqAtIn {
				r.rd[d] = false
			}
		default:
			r.end(r.opErr("read", d, c.Err()), true)
		}
		return
	}
	switch {
	case c.Res > 0:
		dd.pipe.Buffered -= int(c.Res)
		dd.count.Add(int64(c.Res))
		r.touch()
	case c.Res == -int32(unix.EAGAIN):
		// From an empty pipe (the linked read found nothing) it means
		// nothing; with bytes waiting the destination is full.
		if dd.pipe.Buffered > 0 {
			r.wr[1-d] = false
		}
	case c.Res == 0:
	default:
		r.end(r.opErr("write", 1-d, c.Err()), true)
	}
	if !r.closing {
		r.kick(d)
	}
}

// check panics if the relay's bookkeeping is inconsistent (-tags assert).
func (r *uRelay) check() {
	if r.inflight < 0 {
		panic(fmt.Sprintf("engine: io_uring relay has %d requests in flight", r.inflight))
	}
	for d := range r.dir {
		dd := &r.dir[d]
		if dd.chain < 0 || dd.chain > 2 {
			panic(fmt.Sprintf("engine: io_uring relay direction %d has %d splices in flight", d, dd.chain))
		}
		if p := dd.pipe; p != nil && (p.Buffered < 0 || p.Buffered > p.Size) {
			panic(fmt.Sprintf("engine: io_uring relay direction %d holds %d bytes in a %d-byte pipe", d, p.Buffered, p.Size))
		}
	}
}

// kick starts whatever direction d can do next.
func (r *uRelay) kick(d int) {
	dd := &r.dir[d]
	if r.closing || dd.chain > 0 {
		return
	}
	src, dst := d, 1-d
	if p := dd.pipe; p != nil && p.Buffered == 0 {
		r.l.putPipe(p)
		dd.pipe = nil
	}
	if p := dd.pipe; p != nil {
		// Bytes left over from a full destination.
		if !r.wr[dst] {
			r.armOut(dst)
			return
		}
		r.l.sqe().PrepSplice(p.R, r.fd[dst], uint32(p.Buffered), unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE, r.ud(kSpliceOut+uint8(d)))
		dd.chain = 1
		r.inflight++
		return
	}
	if dd.eof {
		if !dd.shut {
			dd.shut = true
			if err := unix.Shutdown(r.fd[dst], unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
				r.end(r.opErr("shutdown", dst, err), true)
				return
			}
		}
		if r.dir[0].shut && r.dir[1].shut {
			r.end(nil, false)
		}
		return
	}
	if !r.rd[src] {
		return
	}
	p, err := r.l.getPipe()
	if err != nil {
		r.end(err, true)
		return
	}
	dd.pipe = p
	dd.seqAtIn = r.pollSeq[src]
	in := r.l.sqe()
	in.PrepSplice(r.fd[src], p.W, uint32(p.Size), unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE, r.ud(kSpliceIn+uint8(d)))
	// Hard-linked: the write runs after the read whatever the read's
	// result, in the same worker, and moves what the read put in the pipe.
	in.Flags |= uring.SQEIOHardlink
	r.l.sqe().PrepSplice(p.R, r.fd[dst], uint32(p.Size), unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE, r.ud(kSpliceOut+uint8(d)))
	dd.chain = 2
	r.inflight += 2
}

func (r *uRelay) touch() {
	if !r.closing {
		r.l.touch(r)
	}
}

// refuse ends a relay the loop never ran.
func (r *uRelay) refuse(err error) {
	r.closing = true
	refuseFDs(r.fd[0], r.fd[1], r.s, err)
}

// end starts tearing the relay down: its requests are cancelled (before
// the descriptors close, so the cancel cannot hit a reused number), the
// sockets closed (reset when abort is set), and the result waits for the
// last completion.
func (r *uRelay) end(err error, abort bool) {
	if r.closing || r.slot < 0 {
		return
	}
	r.closing = true
	r.err = err
	for _, fd := range r.fd {
		if abort {
			_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
		if r.inflight > 0 {
			r.l.sqe().PrepCancelFD(fd, userData(kCancel, 0, 0))
		}
	}
	if r.inflight > 0 {
		// The cancels must run before the descriptors close.
		if _, serr := r.l.ring.Submit(); serr != nil && serr != unix.EBUSY && serr != unix.EAGAIN {
			r.l.b.e.logf("engine: io_uring cancel: %v", serr)
		}
	}
	for _, fd := range r.fd {
		_ = unix.Close(fd)
	}
	if r.inflight == 0 {
		r.finalize()
	}
}

// finalize returns the relay's pipes and slot and reports its result.
func (r *uRelay) finalize() {
	for d := range r.dir {
		if p := r.dir[d].pipe; p != nil {
			r.l.putPipe(p) // closed rather than pooled when it holds bytes
			r.dir[d].pipe = nil
		}
	}
	r.l.release(r)
	r.s.finish(r.err)
}

func (r *uRelay) opErr(op string, side int, err error) error {
	return (&tcpRelay{}).opErr(op, side, err)
}
