package engine

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestReusePortSteersToNewest: two SO_REUSEPORT listeners on one port (an
// old and a new daemon's): every new connection goes to the one that
// joined last, none to the old one, whose queue therefore stays empty;
// once the new one closes, the old one alone gets them again. Without the
// steering program Linux hashes connections across both, and 32 in a row
// landing on one would happen with probability 2^-31.
func TestReusePortSteersToNewest(t *testing.T) {
	ctx := context.Background()
	opts := SocketOptions{ReusePort: true}
	old, err := Listen(ctx, "127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	addr := old.Addr().(*net.TCPAddr).AddrPort()
	newer, err := Listen(ctx, addr.String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()

	// count dials n connections and reports how many each listener took.
	count := func(n int, lns ...*net.TCPListener) []int {
		t.Helper()
		d := &Dialer{}
		var conns []*net.TCPConn
		for range n {
			c, err := d.Dial(ctx, netip.Addr{}, addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		got := make([]int, len(lns))
		for i, ln := range lns {
			for {
				// Every handshake has completed (Dial returned), so what
				// is queued is there now; a short deadline ends the loop.
				ln.SetDeadline(time.Now().Add(50 * time.Millisecond))
				c, err := ln.AcceptTCP()
				if err != nil {
					break
				}
				c.Close()
				got[i]++
			}
		}
		return got
	}
	if got := count(32, old, newer); got[0] != 0 || got[1] != 32 {
		t.Fatalf("old listener took %d, new %d; want all 32 on the new one", got[0], got[1])
	}
	newer.Close()
	if got := count(8, old); got[0] != 8 {
		t.Fatalf("alone again, the old listener took %d of 8", got[0])
	}
}
