package load

import (
	"context"
	"net"
	"sync"
)

// Acceptor runs a handler per accepted connection and owns those goroutines,
// so that a server's end closes every connection it still holds and returns
// only once their handlers are done. The load server and every peer proxy of
// bench/peers accept through it: one accept loop, one shutdown order. The
// zero value is usable; one Acceptor serves one listener.
type Acceptor struct {
	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Serve accepts on ln until ctx ends or ln fails and runs handle on a
// goroutine per connection, closing the connection when handle returns. On
// the way out it cancels the handlers' context, closes ln and every open
// connection, and waits for every handler (and every goroutine started with
// Go). It returns nil when ctx ended it, else the accept error (unwrapped:
// the caller names itself).
func (a *Acceptor) Serve(ctx context.Context, ln net.Listener, handle func(ctx context.Context, c net.Conn)) error {
	a.mu.Lock()
	if a.conns == nil {
		a.conns = map[net.Conn]struct{}{}
	}
	a.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	for {
		var c net.Conn
		if c, err = ln.Accept(); err != nil {
			break
		}
		a.mu.Lock()
		a.conns[c] = struct{}{}
		a.mu.Unlock()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer a.forget(c)
			handle(ctx, c)
		}()
	}
	ended := ctx.Err() != nil
	cancel()
	ln.Close()
	a.mu.Lock()
	for c := range a.conns {
		c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
	if ended {
		return nil
	}
	return err
}

// forget takes c out of a.conns and closes it.
func (a *Acceptor) forget(c net.Conn) {
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
	c.Close()
}

// Go runs fn on a goroutine that Serve waits for: a handler's helper (one
// direction of a relay) must not outlive the server either.
func (a *Acceptor) Go(fn func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		fn()
	}()
}
