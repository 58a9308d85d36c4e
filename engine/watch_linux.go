package engine

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/engine/poll"
)

// watcher is the engine's one goroutine that waits for many idle sockets
// (listeners, a DNS proxy's UDP sockets) at once: each is registered in
// one epoll instance, level-triggered and one-shot, and when one is ready
// the watcher runs its callback and arms it again. A node in shared mode
// has seven such sockets per pod; a goroutine blocked on each cost ~3 KiB
// of stack apiece, while here a quiet pod costs only its epoll entries.
type watcher struct {
	p *poll.Poller

	mu      sync.Mutex // guards the following fields
	watches map[uint64]*watch
	next    uint64
	closed  bool

	done chan struct{} // closed when run has returned
}

// watch is one socket on the watcher.
type watch struct {
	w   *watcher
	fd  int
	tag uint64
	fn  func() time.Duration

	mu      sync.Mutex // held while fn runs and by stop; guards stopped
	stopped bool
}

// WatchReadable hands rc's socket to the engine's watcher goroutine: when
// the socket is readable (a listener has a connection queued, a UDP socket
// a datagram) the watcher calls fn, on its own goroutine, and then waits
// for the socket again. fn must not block: it takes what is ready (one
// accept, one datagram) without waiting and hands any longer work to a
// goroutine. It returns 0 to be called again as soon as the socket is
// still or again readable, or how long to leave the socket alone first (a
// backoff after EMFILE, which would otherwise leave a listener readable
// and the watcher spinning).
//
// stop takes the socket off the watcher; once it returns fn is not
// running and will not run again. Call it before closing the socket (the
// descriptor number could otherwise be reused while still registered).
// Callers that serve a socket from a goroutine of their own need none of
// this; it is for the many sockets that are idle nearly always.
func (e *Engine) WatchReadable(rc syscall.RawConn, fn func() time.Duration) (stop func(), err error) {
	wr, err := e.watcher()
	if err != nil {
		return nil, err
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		return nil, fmt.Errorf("engine: watch: %w", err)
	}
	wr.mu.Lock()
	if wr.closed {
		wr.mu.Unlock()
		return nil, ErrClosed
	}
	wr.next++
	w := &watch{w: wr, fd: fd, tag: wr.next, fn: fn}
	wr.watches[w.tag] = w
	wr.mu.Unlock()
	if err := wr.p.Add(fd, poll.In|unix.EPOLLONESHOT, w.tag); err != nil {
		wr.forget(w)
		return nil, fmt.Errorf("engine: watch: %w", err)
	}
	return w.stop, nil
}

// watcher returns the engine's watcher, started on first use.
func (e *Engine) watcher() (*watcher, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if e.watch != nil {
		return e.watch, nil
	}
	p, err := poll.Open()
	if err != nil {
		return nil, fmt.Errorf("engine: watcher: %w", err)
	}
	e.watch = &watcher{p: p, watches: map[uint64]*watch{}, done: make(chan struct{})}
	go e.watch.run()
	return e.watch, nil
}

func (wr *watcher) run() {
	defer close(wr.done)
	events := make([]poll.Event, 64)
	for {
		n, _, err := wr.p.WaitPark(events, -1)
		wr.mu.Lock()
		closed := wr.closed
		wr.mu.Unlock()
		if closed {
			return
		}
		if err != nil {
			if errors.Is(err, poll.ErrClosed) {
				return
			}
			continue // EINTR and friends
		}
		for _, ev := range events[:n] {
			wr.mu.Lock()
			w := wr.watches[ev.Tag]
			wr.mu.Unlock()
			if w != nil {
				w.ready()
			}
		}
	}
}

// ready runs fn and arms the socket again (at once, or after fn's delay).
func (w *watch) ready() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if d := w.fn(); d > 0 {
		time.AfterFunc(d, w.arm)
		return
	}
	w.armLocked()
}

func (w *watch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armLocked()
}

func (w *watch) armLocked() {
	if w.stopped {
		return
	}
	// Fails only once the poller is closed (the engine is closing).
	_ = w.w.p.Modify(w.fd, poll.In|unix.EPOLLONESHOT, w.tag)
}

func (w *watch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	_ = w.w.p.Delete(w.fd)
	w.w.forget(w)
}

func (wr *watcher) forget(w *watch) {
	wr.mu.Lock()
	delete(wr.watches, w.tag)
	wr.mu.Unlock()
}

// close ends the watcher goroutine; sockets still registered are left to
// their owners (their stop functions then do nothing harmful).
func (wr *watcher) close() {
	wr.mu.Lock()
	wr.closed = true
	wr.mu.Unlock()
	_ = wr.p.Wake()
	<-wr.done
	_ = wr.p.Close()
}
