package hbone

import (
	"errors"
	"net"
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
	}{
		{"pool closes its connection to a revoked server", p.CloseConns, is("a"), "a"},
		{"server closes its connection from a revoked client", ts.Server.CloseConns, isPeer("b"), "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := tc.closer(tc.match, errRevoked); n != 1 {
				t.Fatalf("closed %d connections, want 1", n)
			}
			_ = streams[tc.key].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := streams[tc.key].Read(make([]byte, 1)); err == nil {
				t.Fatal("a stream of the closed connection still reads")
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
