package hbone

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"time"
)

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Config is the per-connection HTTP/2 configuration (client defaults).
	Config
	// MaxStreamsPerConn caps the streams of one pooled connection, further
	// capped by the peer's SETTINGS_MAX_CONCURRENT_STREAMS; when every
	// connection of a key is full a new one is dialed. Default 100
	// (POOL_MAX_STREAMS_PER_CONNECTION).
	MaxStreamsPerConn int
	// IdleTimeout closes a connection that had no stream for this long.
	// Default 5m (POOL_UNUSED_RELEASE_TIMEOUT).
	IdleTimeout time.Duration
}

// DefaultPoolIdleTimeout is POOL_UNUSED_RELEASE_TIMEOUT.
const DefaultPoolIdleTimeout = 5 * time.Minute

// connectAttempts bounds retries of streams the peer did not process.
const connectAttempts = 3

// Pool holds client connections keyed by an opaque string. The proxy builds
// keys from the source identity, the destination SANs, the source IP and the
// destination address, so connections are shared only where they are
// interchangeable.
type Pool struct {
	cfg         Config
	idleTimeout time.Duration

	mu     sync.Mutex // guards the following fields
	keys   map[string]*poolKey
	closed bool
}

type poolKey struct {
	conns []*ClientConn
	dial  *dialCall // the dial in progress, if any
}

// dialCall is one dial that concurrent Connects for a key wait on.
type dialCall struct {
	done    chan struct{}
	err     error
	waiters int // Connects waiting on it (observed by tests)
}

// NewPool returns an empty pool.
func NewPool(cfg PoolConfig) *Pool {
	c := cfg.Config
	if cfg.MaxStreamsPerConn > 0 {
		c.MaxStreams = uint32(cfg.MaxStreamsPerConn)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultPoolIdleTimeout
	}
	return &Pool{cfg: c.withDefaults(false), idleTimeout: cfg.IdleTimeout, keys: make(map[string]*poolKey)}
}

// Connect opens a CONNECT stream on a connection for key: one that can take a
// stream, else a new one from dial (which must return a connection ready
// for HTTP/2, e.g. a *tls.Conn that negotiated "h2"). Concurrent first dials
// for one key coalesce into one dial. A stream the peer refused unprocessed
// (REFUSED_STREAM, GOAWAY) is retried on another connection.
func (p *Pool) Connect(ctx context.Context, key string, dial func(ctx context.Context) (net.Conn, error), req *Request) (*Stream, error) {
	for attempt := 1; ; attempt++ {
		cc, err := p.get(ctx, key, dial)
		if err != nil {
			return nil, err
		}
		s, err := cc.connectReserved(ctx, req)
		if err == nil || attempt == connectAttempts || ctx.Err() != nil || !retryable(err) {
			return s, err
		}
	}
}

func retryable(err error) bool {
	var ns *notSentError
	return errors.Is(err, ErrRefused) || errors.As(err, &ns)
}

// get returns a connection for key with a stream slot reserved.
func (p *Pool) get(ctx context.Context, key string, dial func(ctx context.Context) (net.Conn, error)) (*ClientConn, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		k := p.keys[key]
		if k == nil {
			k = &poolKey{}
			p.keys[key] = k
		}
		for _, cc := range k.conns {
			if cc.tryReserve() {
				p.mu.Unlock()
				return cc, nil
			}
		}
		if d := k.dial; d != nil {
			d.waiters++
			p.mu.Unlock()
			select {
			case <-d.done:
			case <-ctx.Done():
				p.mu.Lock()
				d.waiters--
				p.mu.Unlock()
				return nil, ctx.Err()
			}
			p.mu.Lock()
			d.waiters--
			if d.err != nil && !errors.Is(d.err, context.Canceled) && !errors.Is(d.err, context.DeadlineExceeded) {
				// Share the failure instead of every waiter redialing a
				// peer that just refused; a dial cut short by its
				// caller's context is retried by the next waiter.
				p.mu.Unlock()
				return nil, d.err
			}
			continue
		}
		d := &dialCall{done: make(chan struct{})}
		k.dial = d
		p.mu.Unlock()
		cc, err := p.dial(ctx, key, dial)
		p.mu.Lock()
		k.dial = nil
		d.err = err
		close(d.done)
		if err != nil {
			p.dropKeyIfEmptyLocked(key, k)
			p.mu.Unlock()
			return nil, err
		}
		if p.closed {
			p.mu.Unlock()
			_ = cc.Close()
			return nil, ErrPoolClosed
		}
		k.conns = append(k.conns, cc)
		// Take the first slot of our own dial; if even that fails the
		// connection died at once, and dialing again would only loop.
		ok := cc.tryReserve()
		p.mu.Unlock()
		if admit := p.cfg.Admit; admit != nil {
			// Registered first: see Config.Admit. Streams other callers
			// reserved meanwhile fail with the connection.
			if err := admit(cc.c.nc); err != nil {
				cc.c.forceClose(err)
				return nil, err
			}
		}
		if !ok {
			if err := cc.Err(); err != nil {
				return nil, err
			}
			return nil, ErrGoingAway
		}
		return cc, nil
	}
}

func (p *Pool) dial(ctx context.Context, key string, dial func(ctx context.Context) (net.Conn, error)) (*ClientConn, error) {
	nc, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	return newClientConn(nc, p.cfg, p.idleTimeout, func(cc *ClientConn) { p.remove(key, cc) }), nil
}

// remove forgets a connection that ended.
func (p *Pool) remove(key string, cc *ClientConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.keys[key]
	if k == nil {
		return
	}
	if i := slices.Index(k.conns, cc); i >= 0 {
		k.conns = slices.Delete(k.conns, i, i+1)
	}
	p.dropKeyIfEmptyLocked(key, k)
}

func (p *Pool) dropKeyIfEmptyLocked(key string, k *poolKey) {
	if len(k.conns) == 0 && k.dial == nil && p.keys[key] == k {
		delete(p.keys, key)
	}
}

// CloseConns closes abruptly, with cause, every pooled connection whose
// network connection match accepts (a caller that knows what the transport
// is, such as a TLS connection, asserts it), and returns how many it closed.
// Their streams fail and later Connects dial anew. match runs without the
// pool's lock held, so it may take its time.
func (p *Pool) CloseConns(match func(net.Conn) bool, cause error) int {
	p.mu.Lock()
	var conns []*ClientConn
	for _, k := range p.keys {
		conns = append(conns, k.conns...)
	}
	p.mu.Unlock()
	n := 0
	for _, cc := range conns {
		if match(cc.c.nc) {
			cc.c.forceClose(cause)
			n++
		}
	}
	return n
}

// Close closes every connection abruptly and waits for their goroutines to
// end. Later Connects fail with ErrPoolClosed.
func (p *Pool) Close() error {
	conns := p.closeAll()
	// In parallel: each close may spend up to abruptCloseTimeout on the
	// TLS alert it owes a peer that stopped reading.
	var wg sync.WaitGroup
	for _, cc := range conns {
		wg.Go(func() { _ = cc.Close() })
	}
	wg.Wait()
	return nil
}

// Shutdown closes the pool gracefully, as a draining daemon does once its
// proxies are done: later Connects fail with ErrPoolClosed, and every
// connection gets a GOAWAY and closes once its open streams end (at once
// when it has none), cleanly, its last bytes flushed; what is still open
// when ctx ends is closed abruptly, and Shutdown returns ctx's error. It
// waits for every connection to end.
func (p *Pool) Shutdown(ctx context.Context) error {
	conns := p.closeAll()
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, cc := range conns {
		wg.Go(func() { errs[i] = cc.Shutdown(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// closeAll refuses later Connects and returns the pool's connections.
func (p *Pool) closeAll() []*ClientConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var conns []*ClientConn
	for _, k := range p.keys {
		conns = append(conns, k.conns...)
	}
	return conns
}
