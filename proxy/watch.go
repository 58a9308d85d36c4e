package proxy

import (
	"errors"
	"net"
	"os"
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
	work    chan *net.TCPConn
	backoff time.Duration // after a failed accept; only the watcher touches it
	unwatch func()
}

func (p *Proxy) watchListener(ln *net.TCPListener, use budgetUse, serve func(*net.TCPConn) bool) (*watchedListener, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	wl := &watchedListener{p: p, ln: ln, use: use, serve: serve, work: make(chan *net.TCPConn)}
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
	close(wl.work)
}
