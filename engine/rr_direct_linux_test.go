package engine_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/hbone/hbonetest"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// directRig is one HBONE stream relayed to a TCP socket by an epoll
// engine: client is the application's end, a the relay's.
type directRig struct {
	e         *engine.Engine
	client, a *net.TCPConn
	done      chan engine.Result
	counters  engine.Counters
}

func startDirectRig(t *testing.T, cfg hbone.Config, ecfg engine.Config, h hbone.Handler, tune func(client, a *net.TCPConn)) *directRig {
	t.Helper()
	srvTLS, cliTLS := hbonetest.SelfSignedTLS(t)
	srv := hbonetest.Start(t, hbone.Config{}, h, srvTLS)
	ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
	t.Cleanup(cancel)
	nc, err := srv.Dial(ctx, cliTLS)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ecfg.Backend, ecfg.Loops = engine.BackendEpoll, 1
	e, err := engine.New(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	s, err := cc.Connect(ctx, &hbone.Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	r := &directRig{e: e, done: make(chan engine.Result, 1)}
	r.client, r.a = nettest.TCPPair(t)
	if tune != nil {
		tune(r.client, r.a)
	}
	e.Start(engine.TCPEndpoint{TCPConn: r.a}, hboneEndpoint{s}, &r.counters, func(res engine.Result) { r.done <- res })
	return r
}

// wait ends the client's side cleanly and returns the relay's result.
func (r *directRig) wait(t *testing.T) {
	t.Helper()
	select {
	case res := <-r.done:
		if res.Err != nil {
			t.Errorf("relay ended with %v", res.Err)
		}
	case <-time.After(hangLimit):
		t.Fatal("relay did not end")
	}
}

// TestDirectDeliveryRoundTrips runs 1-byte round trips through an epoll
// stream relay and checks that the responses went to the socket from the
// HBONE reader goroutine (Stats.DirectWrites), not through a wake-up of
// the loop, with the counters and the FIN after them as on the loop's
// path.
func TestDirectDeliveryRoundTrips(t *testing.T) {
	r := startDirectRig(t, hbone.Config{}, engine.Config{}, hbonetest.Echo, nil)
	const trips = 300
	var b [1]byte
	for i := range trips {
		_ = r.client.SetDeadline(time.Now().Add(hangLimit))
		if _, err := r.client.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r.client, b[:]); err != nil {
			t.Fatal(err)
		}
		if b[0] != byte(i) {
			t.Fatalf("round trip %d: got %d", i, b[0])
		}
	}
	// The echo ends its side after ours: END_STREAM after directly
	// delivered bytes must still reach the socket as a FIN.
	if err := r.client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(r.client); err != nil || len(rest) != 0 {
		t.Fatalf("after the round trips: %d bytes, %v; want EOF", len(rest), err)
	}
	r.wait(t)
	direct := r.e.Stats().DirectWrites
	t.Logf("%d of %d responses written directly", direct, trips)
	// The first responses may race the relay's start; nearly all the
	// others find the direction idle.
	if direct < trips/2 {
		t.Errorf("DirectWrites = %d after %d round trips, want most of them", direct, trips)
	}
	if up, down := r.counters.AToB.Load(), r.counters.BToA.Load(); up != trips || down != trips {
		t.Errorf("counters: %d up, %d down; want %d each", up, down, trips)
	}
}

// TestDirectDeliveryOrderWhenPartial streams a pattern in small DATA
// frames to a socket with small buffers whose reader starts late: the
// first frames go straight to the socket until it is full, then direct
// writes meet it full (partial writes and EAGAIN) and fall back to the
// loop, and the bytes must still arrive whole and in order.
func TestDirectDeliveryOrderWhenPartial(t *testing.T) {
	const size, chunk = 512 << 10, 700
	pattern := payload(7, size)
	streamer := func(_ context.Context, req *hbone.ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			return
		}
		go func() {
			defer s.Close()
			// Start once the relay runs (the client's go byte): frames
			// that come before are buffered, and the loop takes them.
			var b [1]byte
			if _, err := io.ReadFull(s, b[:]); err != nil {
				return
			}
			for off := 0; off < size; off += chunk {
				if _, err := s.Write(pattern[off:min(off+chunk, size)]); err != nil {
					return
				}
				// Paced, so frames arrive one by one, mostly to an idle
				// direction, faster than the reader takes them.
				time.Sleep(100 * time.Microsecond)
			}
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s)
		}()
	}
	// Small receive windows keep the backlog the loop holds small, so
	// that it drains between the reader's reads.
	small := hbone.Config{StreamWindow: 65535, ConnWindow: 65535}
	r := startDirectRig(t, small, engine.Config{}, streamer, func(client, a *net.TCPConn) {
		_ = a.SetWriteBuffer(4 << 10)
		_ = client.SetReadBuffer(8 << 10)
	})
	if _, err := r.client.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the socket fill
	got := make([]byte, 0, size)
	buf := make([]byte, 1500)
	for {
		_ = r.client.SetReadDeadline(time.Now().Add(hangLimit))
		n, err := r.client.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		// A slow reader: the loop drains what it holds, the next frames
		// find the direction idle and go straight to the socket until
		// it is full again.
		time.Sleep(time.Millisecond)
	}
	if len(got) != size {
		t.Fatalf("got %d bytes, want %d", len(got), size)
	}
	for i := range got {
		if got[i] != pattern[i] {
			t.Fatalf("byte %d differs: the order was not kept", i)
		}
	}
	_ = r.client.CloseWrite()
	r.wait(t)
	direct, short := r.e.Stats().DirectWrites, engine.DirectShortWrites(r.e)
	t.Logf("%d direct writes, %d of them short or refused by a full socket", direct, short)
	if direct == 0 {
		t.Error("no direct write: the test did not exercise the direct path")
	}
	if short == 0 {
		t.Error("no direct write met a full socket: the test did not exercise the fallback")
	}
	if down := r.counters.BToA.Load(); down != size {
		t.Errorf("counted %d bytes down, want %d", down, size)
	}
}

// TestDirectDeliveryIdleTimeout: a relay whose only traffic goes straight
// to its socket (TryDeliver, which the loop does not see) is active for
// the idle timeout, and still ends by it once that traffic stops.
func TestDirectDeliveryIdleTimeout(t *testing.T) {
	const idle, pushes, every = 150 * time.Millisecond, 12, 50 * time.Millisecond
	pusher := func(_ context.Context, req *hbone.ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			return
		}
		go func() {
			defer s.Close()
			for i := range pushes {
				time.Sleep(every)
				if _, err := s.Write([]byte{byte(i)}); err != nil {
					return
				}
			}
			_, _ = io.Copy(io.Discard, s) // then quiet, until the relay ends
		}()
	}
	r := startDirectRig(t, hbone.Config{}, engine.Config{IdleTimeout: idle}, pusher, nil)
	var b [1]byte
	for i := range pushes {
		_ = r.client.SetReadDeadline(time.Now().Add(hangLimit))
		if _, err := io.ReadFull(r.client, b[:]); err != nil {
			t.Fatalf("push %d of %d (%v in, idle timeout %v): %v", i, pushes, time.Duration(i+1)*every, idle, err)
		}
		if b[0] != byte(i) {
			t.Fatalf("push %d: got %d", i, b[0])
		}
	}
	quiet := time.Now()
	select {
	case res := <-r.done:
		if !errors.Is(res.Err, engine.ErrIdleTimeout) {
			t.Fatalf("relay ended with %v, want ErrIdleTimeout", res.Err)
		}
		t.Logf("ended %v after the last push (idle timeout %v)", time.Since(quiet).Round(time.Millisecond), idle)
	case <-time.After(hangLimit):
		t.Fatal("the relay did not time out once quiet")
	}
	if direct := r.e.Stats().DirectWrites; direct < pushes/2 {
		t.Errorf("DirectWrites = %d of %d pushes: the test did not exercise the direct path", direct, pushes)
	}
}
