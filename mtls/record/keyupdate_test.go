package record

import (
	"bytes"
	"fmt"
	"testing"
)

// secrets returns copies of c's current read and write secrets.
func secrets(c *Conn) (in, out []byte) {
	c.rmu.Lock()
	in = bytes.Clone(c.in.secret)
	c.rmu.Unlock()
	c.wmu.Lock()
	out = bytes.Clone(c.out.secret)
	c.wmu.Unlock()
	return in, out
}

// TestKeyUpdate: after a KeyUpdate that requests the peer's, both
// directions move to new keys (the peer's answer exercises our read-side
// update) and data keeps flowing both ways.
func TestKeyUpdate(t *testing.T) {
	for _, tc := range []struct {
		cli, srv    kind
		updater     string // which end calls KeyUpdate
		requestPeer bool
	}{
		{kindOurs, kindTLS, "client", true},
		{kindOurs, kindTLS, "client", false},
		{kindTLS, kindOurs, "server", true},
		{kindOurs, kindOurs, "client", true},
		{kindOurs, kindOurs, "server", true},
	} {
		t.Run(fmt.Sprintf("%s-client/%s-server/%s/request=%v", tc.cli, tc.srv, tc.updater, tc.requestPeer), func(t *testing.T) {
			cli, srv := pair(t, tc.cli, tc.srv, nil)
			var us *Conn
			if tc.updater == "server" {
				us = srv.(*Conn)
			} else {
				us = cli.(*Conn)
			}
			exchange(t, cli, srv, 30000)
			in0, out0 := secrets(us)
			for range 3 {
				if err := us.KeyUpdate(tc.requestPeer); err != nil {
					t.Fatal(err)
				}
				exchange(t, cli, srv, 30000)
			}
			in1, out1 := secrets(us)
			if bytes.Equal(out0, out1) {
				t.Error("write secret unchanged after KeyUpdate")
			}
			if got := !bytes.Equal(in0, in1); got != tc.requestPeer {
				t.Errorf("read secret changed = %v, want %v", got, tc.requestPeer)
			}
		})
	}
}

// TestAutomaticRekey: after rekeyAfter records with one key, Write sends a
// KeyUpdate on its own.
func TestAutomaticRekey(t *testing.T) {
	old := rekeyAfter
	rekeyAfter = 5
	t.Cleanup(func() { rekeyAfter = old })
	for _, srvKind := range []kind{kindTLS, kindOurs} {
		t.Run(string(srvKind)+"-server", func(t *testing.T) {
			cli, srv := pair(t, kindOurs, srvKind, nil)
			us := cli.(*Conn)
			_, out0 := secrets(us)
			for range 3 {
				exchange(t, cli, srv, 1<<20) // 64 records each way
			}
			_, out1 := secrets(us)
			if bytes.Equal(out0, out1) {
				t.Fatal("write secret unchanged after 192 records")
			}
			us.wmu.Lock()
			seq := us.out.seq
			us.wmu.Unlock()
			if seq > rekeyAfter {
				t.Fatalf("%d records sent with the current key, limit %d", seq, rekeyAfter)
			}
		})
	}
}
