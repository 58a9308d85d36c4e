package engine

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ztunnel-go/ztunnel/engine/bufpool"
)

// stdRelay is the portable backend: one goroutine per direction, io.Copy
// (which splices between two TCP sockets) or pooled buffers otherwise. It
// serves the "std" engine and every pair that is not TCP to TCP.
type stdRelay struct {
	a, b     Endpoint
	once     sync.Once
	firstErr error

	// mu orders one direction's check for a reset at its end of stream
	// against the other direction's half-close of the same socket (see
	// endOfStream).
	mu      sync.Mutex
	finSent [2]bool // guarded by mu: CloseWrite was called on a (0), b (1)
}

// abort ends the relay from outside (Handle.Abort, Engine.Close).
func (r *stdRelay) abort(cause error) { r.fail(cause) }

func (r *stdRelay) fail(err error) {
	r.once.Do(func() {
		r.firstErr = err
		_ = r.a.Abort()
		_ = r.b.Abort()
	})
}

// run relays until both directions end, using the calling goroutine for the
// B→A direction and one more goroutine for A→B.
func (r *stdRelay) run(counters *Counters) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.pipe(r.b, r.a, 1, &counters.AToB)
	}()
	r.pipe(r.a, r.b, 0, &counters.BToA)
	wg.Wait()
	_ = r.a.Close()
	_ = r.b.Close()
	// The once orders firstErr's write before this read.
	r.once.Do(func() {})
	return r.firstErr
}

// pipe copies src to dst. A clean EOF half-closes dst; any error, or an
// EOF that a reset caused, aborts both. dstSide is 0 when dst is A, 1 when
// it is B.
func (r *stdRelay) pipe(dst, src Endpoint, dstSide int, n *atomic.Int64) {
	err := copyCounting(dst, src, n)
	if err == nil {
		err = r.endOfStream(src, dstSide)
	}
	if err == nil {
		if cerr := dst.CloseWrite(); cerr != nil && !isClosed(cerr) {
			r.fail(cerr)
		}
		return
	}
	r.fail(err)
}

// endOfStream runs when src reached EOF: it returns a reset error if a
// reset, not a FIN, ended src, and otherwise records that the other
// endpoint (dstSide) is about to be half-closed.
//
// Linux hands a socket's reset error to one caller only. When the other
// direction's write to src takes it (ECONNRESET), a read of src then sees
// a plain EOF; passing that on as a FIN would show dst's peer a clean close
// where the event loops (one goroutine per socket pair, so the error is
// never split) show a reset. A reset moves the socket straight to CLOSE,
// while a FIN leaves it in CLOSE_WAIT until this side shuts down too; so
// CLOSE here, with no FIN sent on src by this relay, means a reset. The
// lock keeps the other direction's half-close of src (CLOSE_WAIT →
// LAST_ACK → CLOSE) from slipping in between the check of finSent and the
// look at the state.
func (r *stdRelay) endOfStream(src Endpoint, dstSide int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := src.(TCPEndpoint); ok && !r.finSent[1-dstSide] && WasReset(t.TCPConn) {
		return &net.OpError{Op: "read", Net: "tcp", Source: t.LocalAddr(), Addr: t.RemoteAddr(), Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	}
	r.finSent[dstSide] = true
	return nil
}

func copyCounting(dst, src Endpoint, n *atomic.Int64) error {
	// Between two TCP sockets, io.Copy uses splice(2); count through the
	// return value since the kernel moves the bytes.
	if d, ok := dst.(TCPEndpoint); ok {
		if s, ok := src.(TCPEndpoint); ok {
			_, err := io.Copy(countingWriter{d.TCPConn, n}, s.TCPConn)
			return err
		}
	}
	buf := bufpool.Get(bufpool.DefaultSize)
	defer bufpool.Put(buf)
	for {
		nr, rerr := src.Read(*buf)
		if nr > 0 {
			nw, werr := dst.Write((*buf)[:nr])
			n.Add(int64(nw))
			if werr != nil {
				return werr
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// countingWriter forwards ReadFrom to the TCP connection so io.Copy can
// still splice, and counts what moved.
type countingWriter struct {
	c *net.TCPConn
	n *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	nw, err := w.c.Write(p)
	w.n.Add(int64(nw))
	return nw, err
}

func (w countingWriter) ReadFrom(r io.Reader) (int64, error) {
	// ReadFrom on a TCPConn splices from another TCPConn; the kernel path
	// reports the total only at the end, so count in chunks to show progress.
	var total int64
	for {
		nw, err := w.c.ReadFrom(io.LimitReader(r, spliceChunk))
		total += nw
		w.n.Add(nw)
		if err != nil {
			return total, err
		}
		if nw < spliceChunk {
			return total, nil
		}
	}
}

// spliceChunk bounds one splice-backed ReadFrom so counters move during long
// transfers.
const spliceChunk = 4 << 20

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ENOTCONN)
}
