package hbone

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestCloseConns closes chosen connections of a pool (client side) and of a
// server (server side) by their network connections, as a CRL reload does
// for a revoked peer, and checks that the others carry on.
func TestCloseConns(t *testing.T) {
	errRevoked := errors.New("peer revoked")
	ts := startServer(t, Config{}, echoHandler, true)
	d := &countingDialer{ts: ts}
	p := NewPool(PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	streams := map[string]*Stream{}
	locals := map[string]net.Addr{}
	for _, key := range []string{"a", "b", "c"} {
		s, err := p.Connect(ctx, key, d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		echoRoundTrip(t, s, 1, 100, 10)
		streams[key] = s
		locals[key] = poolConns(p, key)[0].c.nc.LocalAddr()
	}
	is := func(key string) func(net.Conn) bool {
		return func(nc net.Conn) bool { return nc.LocalAddr().String() == locals[key].String() }
	}
	isPeer := func(key string) func(net.Conn) bool {
		return func(nc net.Conn) bool { return nc.RemoteAddr().String() == locals[key].String() }
	}
	for _, tc := range []struct {
		name   string
		closer func(match func(net.Conn) bool, cause error) int
		match  func(net.Conn) bool
		key    string
		goAway bool // the client side must have read a GOAWAY first
	}{
		{"pool closes its connection to a revoked server", p.CloseConns, is("a"), "a", false},
		// As ztunnel's abrupt shutdown: GOAWAY(NO_ERROR), then the close.
		{"server closes its connection from a revoked client", ts.Server.CloseConns, isPeer("b"), "b", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := poolConns(p, tc.key)[0]
			if n := tc.closer(tc.match, errRevoked); n != 1 {
				t.Fatalf("closed %d connections, want 1", n)
			}
			_ = streams[tc.key].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := streams[tc.key].Read(make([]byte, 1)); err == nil {
				t.Fatal("a stream of the closed connection still reads")
			}
			if !tc.goAway {
				return
			}
			select {
			case <-cc.Done(): // the reader has stopped: what it read is recorded
			case <-time.After(10 * time.Second):
			}
			cc.c.mu.Lock()
			got := cc.c.goAwayRecv
			cc.c.mu.Unlock()
			if !got {
				t.Fatalf("the client's connection ended (%v) without a GOAWAY from the server", cc.Err())
			}
		})
	}
	if n := p.CloseConns(func(net.Conn) bool { return false }, errRevoked); n != 0 {
		t.Fatalf("closed %d connections matching nothing", n)
	}
	// The untouched connection carries a new stream without a dial; the
	// pool forgot the closed one, so its key dials again.
	for _, k := range []struct {
		key   string
		dials int32
	}{{"c", 0}, {"a", 1}} {
		before := d.dials.Load()
		s, err := p.Connect(ctx, k.key, d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		echoRoundTrip(t, s, 3, 100, 10)
		s.Close()
		if got := d.dials.Load() - before; got != k.dials {
			t.Fatalf("key %s: %d dials, want %d", k.key, got, k.dials)
		}
	}
}

// TestAdmit: Config.Admit sees each new connection after the pool or server
// registered it (a sweep run from inside Admit already finds it, so a CRL
// reload that sweeps cannot miss a connection checked against the CRLs it
// replaced), a refusal closes the connection with Admit's error before any
// stream, and the pool forgets a refused connection.
func TestAdmit(t *testing.T) {
	errRefused := errors.New("peer revoked meanwhile")
	for _, tc := range []struct {
		name   string
		client bool // Admit on the pool, else on the server
	}{
		{"pool", true},
		{"server", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var refuse atomic.Bool
			var sweeps, seen atomic.Int32
			var p *Pool
			var ts *testServer
			admit := func(nc net.Conn) error {
				sweep := ts.Server.CloseConns
				if tc.client {
					sweep = p.CloseConns
				}
				sweeps.Add(1)
				sweep(func(c net.Conn) bool {
					if c == nc {
						seen.Add(1)
					}
					return false
				}, errRefused)
				if refuse.Load() {
					return errRefused
				}
				return nil
			}
			var scfg, pcfg Config
			if tc.client {
				pcfg.Admit = admit
			} else {
				scfg.Admit = admit
			}
			ts = startServer(t, scfg, echoHandler, true)
			p = NewPool(PoolConfig{Config: pcfg})
			defer p.Close()
			d := &countingDialer{ts: ts}
			ctx := testContext(t)
			req := &Request{Authority: "10.0.0.1:80"}

			s, err := p.Connect(ctx, "k", d.dial, req)
			if err != nil {
				t.Fatal(err)
			}
			echoRoundTrip(t, s, 1, 100, 10)
			s.Close()
			if sweeps.Load() != 1 || seen.Load() != 1 {
				t.Fatalf("Admit ran %d times and its sweep found the connection %d times; want 1 and 1", sweeps.Load(), seen.Load())
			}

			// A refused connection: the next key dials anew, and the
			// refusal is what the caller (pool side) or ServeConn (server
			// side) reports.
			refuse.Store(true)
			_, err = p.Connect(ctx, "k2", d.dial, req)
			if tc.client {
				if !errors.Is(err, errRefused) {
					t.Fatalf("Connect over a refused connection: %v, want %v", err, errRefused)
				}
				if n := len(poolConns(p, "k2")); n != 0 {
					t.Fatalf("the pool kept %d refused connections", n)
				}
			} else {
				if err == nil {
					t.Fatal("a stream went through a connection the server refused")
				}
				select {
				case serr := <-ts.serveErrs:
					if !errors.Is(serr, errRefused) {
						t.Fatalf("ServeConn: %v, want %v", serr, errRefused)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("ServeConn did not return the refusal")
				}
			}
			if got := d.dials.Load(); got != 2 {
				t.Fatalf("%d dials, want 2", got)
			}
		})
	}
}
