package hbone

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// The test side of loop mode: testLoop, an event loop of one goroutine over
// epoll that drives connections as the engine's stream loops do
// (engine/conn.go's contract: Readable at add, on input and after more;
// Writable on room after bytes were held; Flush once per iteration after a
// Wake; a close that flushes, sends the FIN, lingers for the peer's EOF and
// closes; Ended once, the descriptor still open), and loopConn, a
// plaintext transport with mtls/record's fd-mode face over a TCP socket.
// hbone imports neither engine nor mtls/record's fd mode for this: the
// package's tests stay self-contained and test the seam, not the glue.

// Bounds of the test loop's close, as the engine's.
const (
	testLoopFlushTimeout  = 2 * time.Second
	testLoopAbruptTimeout = 500 * time.Millisecond
	testLoopLinger        = time.Second
)

// errLoopAborted and errLoopStopped are what Ended gets after Close(true)
// and when the loop stops with the connection open.
var (
	errLoopAborted = errors.New("test loop: connection aborted")
	errLoopStopped = errors.New("test loop: stopped")
	errLoopFlush   = errors.New("test loop: close flush timed out")
)

type loopOp uint8

const (
	opAdd loopOp = iota
	opWake
	opClose
	opStop
)

type loopTask struct {
	op    loopOp
	e     *loopEntry
	abort bool
}

// testLoop is the event loop.
type testLoop struct {
	epfd, evfd int
	done       chan struct{}

	mu      sync.Mutex
	tasks   []loopTask
	stopped bool

	// Loop goroutine only.
	conns map[int]*loopEntry
	ready []*loopEntry
	flush []*loopEntry
	// calls counts driver calls; inCall is set during one (tests of the
	// seam check who calls them back from where).
	calls  atomic.Int64
	inCall atomic.Bool
}

type entryState uint8

const (
	entryOpen entryState = iota
	entryFlushing
	entryLingering
)

// loopEntry is one driven connection; it is the connection's Owner.
type loopEntry struct {
	l         *testLoop
	fd        int
	d         Driven
	flushOwed atomic.Bool

	// Loop goroutine only.
	added    bool
	owed     bool // a Close came before the add (Start after Close)
	owedAb   bool // and it asked to abort
	state    entryState
	closed   bool
	wrote    bool // a Flush ran since the last Writable
	holding  bool // the last Writable held bytes
	queued   bool // in ready
	onFlush  bool // in flush
	deadline time.Time
	closeErr error
}

// newTestLoop starts a loop, stopped at cleanup (registered now: it runs
// after the cleanups registered later, which end the connections first).
func newTestLoop(t testing.TB) *testLoop {
	t.Helper()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		t.Fatal(err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		_, _ = unix.Close(epfd), unix.Close(evfd)
		t.Fatal(err)
	}
	l := &testLoop{epfd: epfd, evfd: evfd, done: make(chan struct{}), conns: make(map[int]*loopEntry)}
	go l.run()
	t.Cleanup(l.stop)
	return l
}

// stop ends the loop: open connections get Ended(errLoopStopped).
func (l *testLoop) stop() {
	l.submit(loopTask{op: opStop})
	<-l.done
}

// submit queues a task for the loop and wakes it; false once stopped.
func (l *testLoop) submit(t loopTask) bool {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	if t.op == opStop {
		l.stopped = true
	}
	l.tasks = append(l.tasks, t)
	l.mu.Unlock()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(l.evfd, one[:])
	return true
}

// Wake asks for a Flush at the end of the loop's iteration.
func (e *loopEntry) Wake() {
	if e.flushOwed.CompareAndSwap(false, true) {
		e.l.submit(loopTask{op: opWake, e: e})
	}
}

// Start hands the connection to the loop (see Owner).
func (e *loopEntry) Start() {
	if !e.l.submit(loopTask{op: opAdd, e: e}) {
		e.closed = true
		e.d.Ended(errLoopStopped)
		_ = unix.Close(e.fd)
	}
}

// WakeLocal wakes w from e's driver callback: a fromWaker is told so,
// anything else gets Wake.
func (e *loopEntry) WakeLocal(w interface{ Wake() }) {
	if fw, ok := w.(*fromWaker); ok && fw.loop == e.l {
		fw.wakeLocal(e)
		return
	}
	w.Wake()
}

// Close ends the connection on the loop (see Owner).
func (e *loopEntry) Close(abort bool) {
	e.l.submit(loopTask{op: opClose, e: e, abort: abort})
}

// drive is a Config.Drive: it takes the socket of a transport that can
// switch to fd mode (loopConn, mtls/record.Conn) away from the runtime's
// poller, as engine.TakeConn does, and returns the connection's entry for
// Start to add to the loop.
func (l *testLoop) drive(nc net.Conn, d Driven) (Owner, bool) {
	u, ok := nc.(interface {
		NetConn() net.Conn
		UseFD(fd int) error
	})
	if !ok {
		return nil, false
	}
	tc, ok := u.NetConn().(*net.TCPConn)
	if !ok {
		return nil, false
	}
	// DupFD leaves tc open: UseFD runs before the close, so a refusal
	// leaves tc usable.
	fd, err := nettest.DupFD(tc)
	if err != nil {
		return nil, false
	}
	if err := u.UseFD(fd); err != nil {
		_ = unix.Close(fd) // refused (crypto/tls keeps the records): tc goes on
		return nil, false
	}
	// Out of the runtime's poller: the descriptor is the loop's alone.
	_ = tc.Close()
	return &loopEntry{l: l, fd: fd, d: d}, true
}

func (l *testLoop) run() {
	defer close(l.done)
	defer func() { _, _ = unix.Close(l.epfd), unix.Close(l.evfd) }()
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(l.epfd, events, l.waitMillis())
		if err != nil && err != unix.EINTR {
			panic("test loop: epoll_wait: " + err.Error())
		}
		for _, ev := range events[:max(n, 0)] {
			if int(ev.Fd) == l.evfd {
				var buf [8]byte
				_, _ = unix.Read(l.evfd, buf[:])
				continue
			}
			if e := l.conns[int(ev.Fd)]; e != nil {
				e.event(ev.Events)
			}
		}
		if !l.runTasks() {
			return
		}
		ready := l.ready
		l.ready = nil
		for _, e := range ready {
			e.queued = false
			if !e.closed && e.state == entryOpen {
				e.readable()
			}
		}
		flush := l.flush
		l.flush = nil
		for _, e := range flush {
			e.onFlush = false
			if !e.closed && e.state != entryLingering {
				e.flushNow()
			}
		}
		now := time.Now()
		for _, e := range l.conns {
			if e.state != entryOpen && !now.Before(e.deadline) {
				if e.state == entryFlushing {
					e.finish(errLoopFlush, true)
				} else {
					e.finish(e.closeErr, false)
				}
			}
		}
	}
}

// waitMillis is the epoll timeout: none with work ready, else until the
// next deadline (-1: none, no wake-up).
func (l *testLoop) waitMillis() int {
	if len(l.ready) > 0 || len(l.flush) > 0 {
		return 0
	}
	var next time.Time
	for _, e := range l.conns {
		if e.state != entryOpen && (next.IsZero() || e.deadline.Before(next)) {
			next = e.deadline
		}
	}
	if next.IsZero() {
		return -1
	}
	return int(max(time.Until(next), 0)/time.Millisecond) + 1
}

// runTasks runs the queued tasks; false after a stop.
func (l *testLoop) runTasks() bool {
	l.mu.Lock()
	tasks := l.tasks
	l.tasks = nil
	l.mu.Unlock()
	for _, t := range tasks {
		e := t.e
		switch t.op {
		case opAdd:
			e.add()
		case opWake:
			l.markFlush(e)
		case opClose:
			if e.closed {
				continue
			}
			if !e.added {
				e.owed, e.owedAb = true, e.owedAb || t.abort
				continue
			}
			if t.abort {
				e.finish(errLoopAborted, true)
			} else {
				e.startClose(nil, testLoopFlushTimeout)
			}
		case opStop:
			for _, e := range l.conns {
				e.finish(errLoopStopped, true)
			}
			return false
		}
	}
	return true
}

func (l *testLoop) markFlush(e *loopEntry) {
	if !e.added {
		return // flushed after the add
	}
	if e.onFlush || e.closed {
		e.flushOwed.Store(false)
		return
	}
	e.onFlush = true
	l.flush = append(l.flush, e)
}

func (e *loopEntry) add() {
	l := e.l
	e.added = true
	l.conns[e.fd] = e
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(e.fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, e.fd, &ev); err != nil {
		e.finish(err, true)
		return
	}
	switch {
	case e.owed && e.owedAb:
		e.finish(errLoopAborted, true)
		return
	case e.owed:
		e.startClose(nil, testLoopFlushTimeout)
		return
	}
	e.readable()
	l.markFlush(e)
}

func (e *loopEntry) event(ev uint32) {
	if ev&unix.EPOLLERR != 0 {
		if soerr, err := unix.GetsockoptInt(e.fd, unix.SOL_SOCKET, unix.SO_ERROR); err == nil && soerr != 0 {
			e.finish(os.NewSyscallError("socket", syscall.Errno(soerr)), true)
			return
		}
	}
	room := ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0
	input := ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
	switch e.state {
	case entryOpen:
		if room && (e.wrote || e.holding) {
			e.writable()
		}
		if input && !e.closed && e.state == entryOpen {
			e.readable()
		}
	case entryFlushing:
		if room {
			e.writable()
		}
	case entryLingering:
		if input {
			e.discard()
		}
	}
}

func (e *loopEntry) readable() {
	e.l.calls.Add(1)
	e.l.inCall.Store(true)
	more, err := e.d.Readable()
	e.l.inCall.Store(false)
	if e.closed {
		return
	}
	if err != nil {
		e.startClose(err, testLoopAbruptTimeout)
		return
	}
	if more && !e.queued && e.state == entryOpen {
		e.queued = true
		e.l.ready = append(e.l.ready, e)
	}
}

func (e *loopEntry) writable() {
	e.l.calls.Add(1)
	e.l.inCall.Store(true)
	more, err := e.d.Writable()
	e.l.inCall.Store(false)
	e.wrote = false
	if e.closed {
		return
	}
	if err != nil {
		e.finish(err, true)
		return
	}
	e.holding = more
	if e.state == entryFlushing && !more {
		e.shut()
	}
}

func (e *loopEntry) flushNow() {
	e.l.calls.Add(1)
	e.flushOwed.Store(false)
	e.l.inCall.Store(true)
	err := e.d.Flush()
	e.l.inCall.Store(false)
	e.wrote = true
	if err != nil && !e.closed {
		e.finish(err, true)
	}
}

func (e *loopEntry) startClose(err error, bound time.Duration) {
	if e.closed || e.state != entryOpen {
		return
	}
	e.state, e.closeErr = entryFlushing, err
	e.deadline = time.Now().Add(bound)
	e.flushNow()
	if e.closed {
		return
	}
	e.writable()
}

func (e *loopEntry) shut() {
	e.state = entryLingering
	e.deadline = time.Now().Add(testLoopLinger)
	if err := unix.Shutdown(e.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
		e.finish(e.closeErr, false)
		return
	}
	e.discard()
}

func (e *loopEntry) discard() {
	var buf [4096]byte
	for {
		n, err := unix.Read(e.fd, buf[:])
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case err != nil || n == 0:
			e.finish(e.closeErr, false)
			return
		}
	}
}

func (e *loopEntry) finish(err error, rst bool) {
	if e.closed {
		return
	}
	e.closed = true
	delete(e.l.conns, e.fd)
	_ = unix.EpollCtl(e.l.epfd, unix.EPOLL_CTL_DEL, e.fd, nil)
	e.l.calls.Add(1)
	e.d.Ended(err)
	if rst {
		_ = unix.SetsockoptLinger(e.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	}
	_ = unix.Close(e.fd)
}
