package load_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
)

// TestAcceptorShutdown: ending ctx closes the connections handlers still
// hold, and Serve returns nil only after every handler and every Go
// goroutine is done.
func TestAcceptorShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var a load.Acceptor
	var done atomic.Int32
	started := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- a.Serve(ctx, ln, func(hctx context.Context, c net.Conn) {
			a.Go(func() { <-hctx.Done(); time.Sleep(10 * time.Millisecond); done.Add(1) })
			close(started)
			_, _ = io.Copy(io.Discard, c) // ends when Serve closes c
			done.Add(1)
		})
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-started
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve after ctx ended: %v, want nil", err)
	}
	if n := done.Load(); n != 2 {
		t.Fatalf("Serve returned with %d of 2 goroutines done", 2-n)
	}
	// The handler's end closed the connection: the client reads EOF.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client read after shutdown: %v, want EOF", err)
	}
}

// TestAcceptorAcceptError: a listener failing on its own is an error.
func TestAcceptorAcceptError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	var a load.Acceptor
	if err := a.Serve(context.Background(), ln, func(context.Context, net.Conn) {}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve on a closed listener: %v, want net.ErrClosed", err)
	}
}
