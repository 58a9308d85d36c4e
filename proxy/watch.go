package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// acceptWait bounds an accept the engine's watcher runs once a listener
// is readable: the connection is queued then, and the accept returns at
// once; the bound only keeps a readiness that vanished (none is known on
// Linux) from stalling every other listener of the node.
const acceptWait = 100 * time.Millisecond

// watchedListener is a listener served from the engine's watcher
// (Config.WatchListeners): each readiness accepts one connection and
// hands it to a worker, as acceptLoop does from a goroutine of its own.
type watchedListener struct {
	p       *Proxy
	ln      *net.TCPListener
	use     budgetUse
	serve   func(*net.TCPConn) bool
	work    chan *net.TCPConn // nil: Config.Workers serves the connections
	backoff time.Duration     // after a failed accept; only the watcher touches it
	unwatch func()
}

func (p *Proxy) watchListener(ln *net.TCPListener, use budgetUse, serve func(*net.TCPConn) bool) (*watchedListener, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	wl := &watchedListener{p: p, ln: ln, use: use, serve: serve}
	if p.cfg.Workers == nil {
		wl.work = make(chan *net.TCPConn)
	}
	if wl.unwatch, err = p.engine.WatchReadable(rc, wl.ready); err != nil {
		return nil, err
	}
	return wl, nil
}

// ready runs on the watcher: one accept, then the connection to a worker.
func (wl *watchedListener) ready() time.Duration {
	_ = wl.ln.SetDeadline(time.Now().Add(acceptWait))
	c, err := wl.ln.AcceptTCP()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0
		}
		// Transient (EMFILE and friends), or closing: leave the listener
		// alone for a while rather than spin on it.
		wl.backoff = min(max(wl.backoff*2, 5*time.Millisecond), time.Second)
		if !errors.Is(err, net.ErrClosed) {
			wl.p.log.Warn("accept failed", "addr", wl.ln.Addr().String(), "error", err)
		}
		return wl.backoff
	}
	wl.backoff = 0
	wl.p.accepted(c, wl.use, wl.serve, wl.work)
	return 0
}

// stop takes the listener off the watcher and ends its idle workers.
func (wl *watchedListener) stop() {
	wl.unwatch()
	if wl.work != nil {
		close(wl.work)
	}
}

// Workers is a pool of connection workers that proxies share
// (Config.Workers): a worker serves an accepted connection, then the next
// one any proxy hands the pool, and ends after workerIdle without one or
// when the pool closes. A worker's stack has grown to what routing and
// dialing need, so a pod's first connection finds one ready, and a node
// whose pods each see a connection now and then keeps a handful of idle
// workers, not one per pod and listener.
type Workers struct {
	work   chan job
	done   chan struct{} // closed by Close
	closed atomic.Bool
	wg     sync.WaitGroup
}

// job is one accepted connection for a pool worker.
type job struct {
	p     *Proxy
	c     *net.TCPConn
	units int
	serve func(*net.TCPConn) bool
}

// NewWorkers returns an empty pool.
func NewWorkers() *Workers {
	return &Workers{work: make(chan job), done: make(chan struct{})}
}

// hand gives j to an idle worker, or to a new one.
func (w *Workers) hand(j job) {
	select {
	case w.work <- j:
		return
	default:
	}
	w.wg.Add(1)
	go w.worker(j)
}

func (w *Workers) worker(j job) {
	defer w.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.p.serveOne(j.c, j.units, j.serve)
		if w.closed.Load() {
			return
		}
		idle.Reset(workerIdle)
		select {
		case j = <-w.work:
		case <-idle.C:
			return
		case <-w.done:
			return
		}
	}
}

// Close ends the idle workers and waits for the busy ones to finish the
// connection they serve (the proxies' Drain ends those). Call it once
// the proxies that use the pool have drained: none hands it work any more.
func (w *Workers) Close() {
	if w.closed.Swap(true) {
		return
	}
	close(w.done)
	w.wg.Wait()
}
