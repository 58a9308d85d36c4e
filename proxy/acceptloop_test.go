package proxy

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
)

// The accept loop hands connections to workers: a blocked serve does not
// hold up the next connection, a finished worker takes the next one, and
// every worker ends when the listener closes (goleak checks in TestMain).
func TestAcceptLoopWorkers(t *testing.T) {
	tests := []struct {
		name    string
		blocked int // connections whose serve blocks until the end
		quick   int // connections served at once, one after another
	}{
		{"one at a time", 0, 5},
		{"blocked serves do not hold up others", 3, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p := &Proxy{log: slog.New(slog.DiscardHandler), conns: map[*net.TCPConn]struct{}{}, ctx: ctx}
			ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			unblock := make(chan struct{})
			served := make(chan bool, tc.blocked+tc.quick)
			var mu sync.Mutex
			n := 0
			serve := func(c *net.TCPConn) bool {
				mu.Lock()
				i := n
				n++
				mu.Unlock()
				if i < tc.blocked {
					served <- true
					<-unblock
				} else {
					served <- false
				}
				c.Close()
				return false
			}
			p.wg.Add(1)
			go p.acceptLoop(ln, budgetUse{listenerOutbound, budgetSocket}, serve)
			dial := func() {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				<-served
			}
			for range tc.blocked {
				dial()
			}
			for range tc.quick {
				dial() // would hang if a blocked serve held it up
			}
			close(unblock)
			ln.Close()
			p.wg.Wait()
			if n != tc.blocked+tc.quick {
				t.Errorf("served %d connections, want %d", n, tc.blocked+tc.quick)
			}
		})
	}
}
