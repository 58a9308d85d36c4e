// Package peers holds the proxies the benchmarks compare the daemon with,
// written the way a Go programmer would write them first: a goroutine per
// direction and io.Copy. They are baselines, not products; each runs as its
// own process (bench/cmd/zpeer) so the harness can measure its CPU and
// memory the same way as the daemon's.
//
//   - Copy: plain TCP proxy (io.Copy splices between two TCP sockets).
//   - TLS: a mutual-TLS 1.3 terminator in front of a TCP backend: the cost of
//     raw Go TLS, the reference for one HBONE hop.
//   - H2Server and H2Client: the naive HBONE, HTTP/2 CONNECT over mutual TLS
//     with golang.org/x/net/http2's Server and Transport.
//
// Imports (of ours): bench/load (its Acceptor) and mtls (and besides the
// standard library, golang.org/x/net/http2 and x/sys/unix). Imported by:
// bench/cmd/zpeer.
package peers

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
)

// Config is shared by every peer. The zero value is usable.
type Config struct {
	// DialTimeout bounds each upstream dial and TLS handshake. Default 10s.
	DialTimeout time.Duration
	// Mark, if non-zero, is the SO_MARK of every upstream socket: with
	// Copy behind a pod's capture rules (mark 1337 bypasses them).
	Mark int
	// Logf receives per-connection errors. Nil discards them.
	Logf func(format string, args ...any)
}

func (c Config) withDefaults() Config {
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

// serve is load.Acceptor's Serve with this package's name on its error.
func serve(ctx context.Context, a *load.Acceptor, ln net.Listener, handle func(ctx context.Context, c net.Conn)) error {
	if err := a.Serve(ctx, ln, handle); err != nil {
		return fmt.Errorf("peers: accept: %w", err)
	}
	return nil
}

type closeWriter interface{ CloseWrite() error }

func closeWrite(c any) {
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
	}
}

// relay copies both ways until both directions end, propagating half-close;
// an error in either direction closes both. It closes a and b.
func relay(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(b, a); err != nil {
			a.Close()
			b.Close()
			return
		}
		closeWrite(b)
	}()
	if _, err := io.Copy(a, b); err != nil {
		a.Close()
		b.Close()
	} else {
		closeWrite(a)
	}
	<-done
	a.Close()
	b.Close()
}

// dialer is the upstream dialer of cfg.
func (c Config) dialer() *net.Dialer {
	d := &net.Dialer{Timeout: c.DialTimeout}
	if c.Mark != 0 {
		d.Control = markControl(c.Mark)
	}
	return d
}

// Copy is the naive TCP proxy: it forwards every connection accepted on ln
// to the address to, or, if to is empty, to the connection's original
// destination (SO_ORIGINAL_DST: ln receives a pod's captured traffic, as the
// daemon's 15001 does).
func Copy(ctx context.Context, ln net.Listener, to string, cfg Config) error {
	cfg = cfg.withDefaults()
	d := cfg.dialer()
	var a load.Acceptor
	return serve(ctx, &a, ln, func(ctx context.Context, c net.Conn) {
		to := to
		if to == "" {
			var err error
			to, err = originalDst(c)
			if err == nil && to == c.LocalAddr().String() {
				// Not redirected (a direct connection to the listener):
				// forwarding would loop into ourselves.
				err = fmt.Errorf("%s is not a redirected connection", c.RemoteAddr())
			}
			if err != nil {
				cfg.Logf("peers: copy: %v", err)
				c.Close()
				return
			}
		}
		up, err := d.DialContext(ctx, "tcp", to)
		if err != nil {
			cfg.Logf("peers: copy: dial %s: %v", to, err)
			c.Close()
			return
		}
		relay(c, up)
	})
}
