package engine

import (
	"fmt"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/engine/splice"
	"golang.org/x/sys/unix"
)

// roundsPerTurn bounds the splice rounds one direction gets per turn, so a
// bulk transfer cannot starve the other relays of its loop; a relay that
// used its budget waits in the loop's ready list for its next turn.
const roundsPerTurn = 4

// scratchSize is the loop's copy buffer (see tcpRelay.pump), the size of
// HAProxy's buffers.
const scratchSize = 16 << 10

// burstBulk is how many bytes one direction moves, with none moving the
// other way meanwhile, before it counts as a bulk flow and splices. The
// size of single reads does not tell: a loop that keeps up with a fast
// stream reads it in small pieces, and copying those costs more than
// splicing them; request/response traffic turns around well before.
const burstBulk = 64 << 10

// tcpRelay is one TCP⇄TCP relay owned by an epoll loop. Side 0 is A, side 1
// is B; direction d moves bytes from side d to side 1-d.
type tcpRelay struct {
	relayBase
	l  *eloop
	s  *session
	fd [2]int
	// rd and wr are the sockets' readiness as last learnt: set by an edge,
	// cleared by EAGAIN (or, for rd, by a short read; see drained).
	rd, wr [2]bool
	// hup is set once a side's events said end of stream, hang-up or
	// error: a short read may then have stopped at the FIN, so only a
	// splice that returns 0 or EAGAIN clears rd.
	hup [2]bool
	// connecting is set while B's connect is in flight (StartDial): the
	// relay moves nothing until it completes.
	connecting bool
	dir        [2]direction
}

func (r *tcpRelay) fdOf(side int) int { return r.fd[side] }

// refuse ends a relay the loop never ran.
func (r *tcpRelay) refuse(err error) {
	r.closed = true
	refuseFDs(r.fd[0], r.fd[1], r.s, err)
}

// direction is one way of a relay.
type direction struct {
	pipe  *splice.Pipe // nil unless bytes are in flight
	count *atomic.Int64
	eof   bool  // the source said end of stream
	shut  bool  // the destination's write side is shut (or about to close)
	bulk  bool  // a one-way burst of burstBulk bytes: splice
	burst int32 // bytes read since the other direction last read any
}

func (d *direction) finished() bool { return d.shut }

// abort is Handle.Abort's way in: it runs on the caller's goroutine and
// hands the work to the owning loop.
func (r *tcpRelay) abort(cause error) {
	r.l.submit(task{op: opAbort, r: r, err: cause})
}

// service moves whatever the sockets' readiness allows, then ends the relay
// if both directions are done or one failed.
func (r *tcpRelay) service() {
	if r.closed {
		return
	}
	more := false
	for d := range 2 {
		m, err := r.pump(d)
		if err != nil {
			r.end(err, true)
			return
		}
		more = more || m
	}
	if assertions {
		r.check()
	}
	if r.dir[0].finished() && r.dir[1].finished() {
		r.end(nil, false)
		return
	}
	if more && !r.queued {
		r.queued = true
		r.l.ready = append(r.l.ready, loopRelay(r))
	}
}

// pump runs direction d until the sockets say EAGAIN (false) or its budget
// is spent with work left (true).
//
// A direction starts out copying: one read into the loop's scratch buffer
// and one send, which for small messages costs less than splicing into a
// pipe and out again, and holds no pipe. A direction that reads burstBulk
// bytes while the other reads none switches to splicing; a read the other
// way switches it back (see noteRead). Bytes that the
// destination does not take are parked in a pipe, so no per-relay buffer
// is held; while a pipe holds bytes, reads splice in behind them.
func (r *tcpRelay) pump(d int) (more bool, err error) {
	dd := &r.dir[d]
	src, dst := d, 1-d
	for range roundsPerTurn {
		moved := false
		if p := dd.pipe; p != nil && p.Buffered > 0 && r.wr[dst] {
			n, err := p.Out(r.fd[dst])
			switch {
			case err == unix.EAGAIN:
				r.wr[dst] = false
			case err != nil:
				return false, r.opErr("write", dst, err)
			case n > 0:
				dd.count.Add(int64(n))
				moved = true
			}
		}
		if p := dd.pipe; p != nil && p.Buffered == 0 {
			r.l.putPipe(p)
			dd.pipe = nil
		}
		if !dd.eof && r.rd[src] {
			var m bool
			if dd.pipe == nil && !dd.bulk {
				m, err = r.copyOnce(d)
			} else {
				m, err = r.spliceIn(d)
			}
			if err != nil {
				return false, err
			}
			moved = moved || m
		}
		if dd.eof && dd.pipe == nil && !dd.shut {
			dd.shut = true
			// When the other way is finished too the relay closes both
			// sockets right after this pass, and a close with nothing
			// left unread sends the FIN itself: no shutdown call.
			if !r.dir[dst].shut {
				if err := unix.Shutdown(r.fd[dst], unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
					return false, r.opErr("shutdown", dst, err)
				}
			}
		}
		if !moved {
			return false, nil
		}
		r.l.touch(&r.relayBase)
	}
	return true, nil
}

// copyOnce reads what the source of direction d holds, up to the scratch
// buffer's size, and sends it on; what the destination does not take is
// parked in a pipe. It runs only while the direction holds no pipe.
func (r *tcpRelay) copyOnce(d int) (moved bool, err error) {
	dd := &r.dir[d]
	src, dst := d, 1-d
	buf := r.l.scratchBuf()
	n, err := unix.Read(r.fd[src], buf)
	for err == unix.EINTR {
		n, err = unix.Read(r.fd[src], buf)
	}
	switch {
	case err == unix.EAGAIN:
		r.rd[src] = false
		return false, nil
	case err != nil:
		return false, r.opErr("read", src, err)
	case n == 0:
		dd.eof = true
		return true, nil
	case n < len(buf) && !r.hup[src]:
		// A read returns everything the socket holds up to its length,
		// and a later segment raises a new edge: a short read means an
		// empty socket (see drained). After a FIN was signalled, probe
		// on to read the end of stream.
		r.rd[src] = false
	}
	r.noteRead(d, n)
	sent := 0
	if r.wr[dst] {
		// write(2): the socket is non-blocking, and the Go runtime makes
		// a broken connection an EPIPE rather than a fatal SIGPIPE.
		sent, err = unix.Write(r.fd[dst], buf[:n])
		for err == unix.EINTR {
			sent, err = unix.Write(r.fd[dst], buf[:n])
		}
		switch {
		case err == unix.EAGAIN:
			r.wr[dst] = false
			sent = 0
		case err != nil:
			return false, r.opErr("write", dst, err)
		}
		dd.count.Add(int64(sent))
	}
	if sent < n {
		p, err := r.l.getPipe()
		if err != nil {
			return false, err
		}
		dd.pipe = p
		if err := p.Park(buf[sent:n]); err != nil {
			return false, fmt.Errorf("engine: park %d bytes in a pipe: %w", n-sent, err)
		}
	}
	return true, nil
}

// spliceIn splices what the source of direction d holds into the
// direction's pipe (taking one if it holds none), behind any bytes already
// there.
func (r *tcpRelay) spliceIn(d int) (moved bool, err error) {
	dd := &r.dir[d]
	src := d
	p := dd.pipe
	if p == nil {
		if p, err = r.l.getPipe(); err != nil {
			return false, err
		}
		dd.pipe = p
	}
	if p.Buffered < p.Size {
		before := p.Buffered
		n, err := p.In(r.fd[src], p.Size)
		switch {
		case err == unix.EAGAIN:
			// With an empty pipe EAGAIN means the socket is empty.
			// With bytes in the pipe the pipe may be out of slots
			// instead, so keep the readiness and retry once it
			// drains.
			if p.Buffered == 0 {
				r.rd[src] = false
			}
		case err != nil:
			return false, r.opErr("read", src, err)
		case n == 0:
			dd.eof = true
			moved = true
		default:
			moved = true
			r.noteRead(d, n)
			if !r.hup[src] && drained(p, before, n) {
				r.rd[src] = false
			}
		}
	}
	if p.Buffered == 0 {
		r.l.putPipe(p)
		dd.pipe = nil
	}
	return moved, nil
}

// noteRead accounts n bytes read by direction d to its burst, and ends
// the other direction's.
func (r *tcpRelay) noteRead(d, n int) {
	dd := &r.dir[d]
	dd.burst = int32(min(int(dd.burst)+n, burstBulk))
	if dd.burst >= burstBulk {
		dd.bulk = true
	}
	o := &r.dir[1-d]
	o.burst, o.bulk = 0, false
}

// drained reports whether a splice that moved n bytes into p, which held
// before bytes, emptied the socket, so that the probe for EAGAIN can be
// skipped: one splice fewer per message, which is a third of the splices of
// request/response traffic. A non-blocking splice from a TCP socket reads
// every queued segment in one pass unless the pipe runs out of room, and
// every segment that arrives later raises a new edge, so a read shorter
// than the pipe's free room means an empty socket. Running out of room
// includes running out of slots (one per page fragment, each holding at
// least one byte): that cannot have happened while the pipe holds fewer
// bytes than it has slots. Bulk reads, which can fill the slots, keep
// probing.
func drained(p *splice.Pipe, before, n int) bool {
	return n < p.Size-before && before+n < p.Slots()
}

// check panics if the relay's bookkeeping is inconsistent (-tags assert).
func (r *tcpRelay) check() {
	for d := range r.dir {
		dd := &r.dir[d]
		if p := dd.pipe; p != nil && (p.Buffered < 0 || p.Buffered > p.Size) {
			panic(fmt.Sprintf("engine: relay direction %d holds %d bytes in a %d-byte pipe", d, p.Buffered, p.Size))
		}
		if dd.shut && (!dd.eof || dd.pipe != nil) {
			panic("engine: relay shut a destination with bytes still in flight")
		}
	}
	if r.l.slots.get(r.slot) != loopRelay(r) {
		panic("engine: relay lost its slot")
	}
}

// end closes both sockets (resetting them when abort is set), returns the
// pipes and reports the result.
func (r *tcpRelay) end(err error, abort bool) {
	if r.closed || r.slot < 0 {
		return
	}
	r.closed = true
	if r.connecting {
		r.connecting = false
		r.l.dialDone(r)
	}
	for d := range r.dir {
		if p := r.dir[d].pipe; p != nil {
			r.l.putPipe(p) // closed rather than pooled when it holds bytes
			r.dir[d].pipe = nil
		}
	}
	for _, fd := range r.fd {
		if abort {
			abortFD(fd)
		} else {
			_ = unix.Close(fd)
		}
	}
	if r.slot >= 0 {
		r.l.release(&r.relayBase)
	}
	r.s.finish(err)
}

func (r *tcpRelay) opErr(op string, side int, err error) error {
	return fmt.Errorf("engine: %s %s: %w", op, sideName[side], err)
}

var sideName = [2]string{"A", "B"}
