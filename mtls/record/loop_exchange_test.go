package record

import (
	"bytes"
	"testing"
)

// Data both ways in fd mode, with key updates and under an edge-triggered
// epoll.

// TestFDExchange runs data both ways between an fd-mode end and a blocking
// one, for each peer kind and role, at sizes around the record size.
func TestFDExchange(t *testing.T) {
	for _, peerKind := range []kind{kindTLS, kindOurs} {
		for _, client := range []bool{true, false} {
			name := string(peerKind) + "-peer/our-" + map[bool]string{true: "client", false: "server"}[client]
			t.Run(name, func(t *testing.T) {
				c, fd, peer := fdPair(t, client, peerKind)
				for _, n := range interopSizes {
					fdExchange(t, c, fd, peer, n)
				}
			})
		}
	}
}

// TestFDKeyUpdate: KeyUpdate both ways in fd mode. Ours (TryKeyUpdate,
// asking the peer to follow or not) moves our write keys, and the peer's
// answer our read keys; the peer's own KeyUpdate, read by TryRead, moves
// our read keys, and when it asks, our next TryWrite answers it.
func TestFDKeyUpdate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		peerKind    kind
		ours        bool // we initiate; else the peer (ours, blocking) does
		requestPeer bool
	}{
		{"ours requesting, tls peer", kindTLS, true, true},
		{"ours not requesting, tls peer", kindTLS, true, false},
		{"ours requesting, our peer", kindOurs, true, true},
		{"peer's requesting", kindOurs, false, true},
		{"peer's not requesting", kindOurs, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fd, peer := fdPair(t, true, tc.peerKind)
			fdExchange(t, c, fd, peer, 30000)
			in0, out0 := secrets(c)
			for range 3 {
				if tc.ours {
					if err := c.TryKeyUpdate(tc.requestPeer); err != nil {
						t.Fatal(err)
					}
				} else if err := peer.(*Conn).KeyUpdate(tc.requestPeer); err != nil {
					t.Fatal(err)
				}
				fdExchange(t, c, fd, peer, 30000)
			}
			in1, out1 := secrets(c)
			wantIn, wantOut := tc.requestPeer || !tc.ours, tc.ours || tc.requestPeer
			if got := !bytes.Equal(in0, in1); got != wantIn {
				t.Errorf("read secret changed = %v, want %v", got, wantIn)
			}
			if got := !bytes.Equal(out0, out1); got != wantOut {
				t.Errorf("write secret changed = %v, want %v", got, wantOut)
			}
		})
	}
}

// TestFDEdgeTriggered runs the exchanges under an edge-triggered epoll, the
// engine's way: reading stops at ErrWouldBlock or when Drained says so, and
// writing waits for EPOLLOUT only when records are held. A wrong Drained
// (true with bytes left) or a held write that never met EAGAIN would leave
// the loop waiting for an edge that never comes.
func TestFDEdgeTriggered(t *testing.T) {
	for _, peerKind := range []kind{kindTLS, kindOurs} {
		t.Run(string(peerKind)+"-peer", func(t *testing.T) {
			c, fd, peer := fdPair(t, true, peerKind)
			wait := edgeWaiter(t, fd)
			for _, n := range append(interopSizes, 8<<20) {
				fdExchangeWith(t, c, wait, peer, n)
			}
		})
	}
}
