package load_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// serveConns runs handle on a goroutine per connection accepted on a
// loopback listener until the test ends.
func serveConns(t *testing.T, handle func(c net.Conn)) string {
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			c, err := ln.Accept()
			if err != nil {
				return nil
			}
			wg.Go(func() {
				defer c.Close()
				cstop := context.AfterFunc(ctx, func() { c.Close() })
				defer cstop()
				handle(c)
			})
		}
	})
}

// The rate of issue 23's CPU measurement: 1,000 requests/s of 1 KiB over
// 10 connections, against an echo server. Every response is matched to its
// request in order (the sequence numbers come back as sent) and the
// achieved rate is the one asked for.
func TestOpenLoopRateAndOrder(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: startServer(t, load.ServerConfig{Raw: true})})
	started := 0
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Count: 500}, Concurrency: 10, ReqSize: 1024, Raw: true, OpenRate: 1000,
		OnStart: func(n int) { started += n },
	})
	if err != nil {
		t.Fatal(err)
	}
	// The Load scenario opens its CPU window on this call: once, with
	// every connection dialed.
	if started != 10 {
		t.Errorf("OnStart saw %d connections, want one call with 10", started)
	}
	if rr.Requests != 500 || rr.Sent != 500 || rr.Errors != 0 || rr.Missed != 0 || rr.Unanswered != 0 || rr.FirstError != "" {
		t.Fatalf("open loop: %+v", rr)
	}
	// 500 requests scheduled over 0.5 s: the rate cannot exceed the
	// schedule's, and a healthy echo keeps up with it.
	if rr.PerSecond < 800 || rr.PerSecond > 1050 || rr.OpenRate != 1000 || rr.RespSize != 1024 {
		t.Fatalf("achieved %.0f/s of 1000/s: %+v", rr.PerSecond, rr)
	}
	if rr.SendLag == nil || rr.Latency.P50 <= 0 {
		t.Fatalf("no latency or send lag: %+v", rr)
	}
}

// A reordered response is an error, not a sample.
func TestOpenLoopDetectsReorder(t *testing.T) {
	const size = 16
	addr := serveConns(t, func(c net.Conn) {
		// Echo the requests in pairs, the second first.
		a, b := make([]byte, size), make([]byte, size)
		for {
			if _, err := io.ReadFull(c, a); err != nil {
				return
			}
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(append(b, a...)); err != nil {
				return
			}
		}
	})
	d := dialer(t, load.DialConfig{Target: addr, Timeout: time.Second})
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Count: 10}, ReqSize: size, Raw: true, OpenRate: 1000,
	})
	if err == nil || rr == nil || rr.Errors != 1 || !strings.Contains(rr.FirstError, "response to request 1 where 0 was due") {
		t.Fatalf("reordered echo: %+v, %v", rr, err)
	}
}

// The writer does not wait for responses: against a server that answers
// each request 50 ms after it arrived, every request still goes out on
// schedule, and the latency shows the delay.
func TestOpenLoopDoesNotWaitForResponses(t *testing.T) {
	const size, delay = 8, 50 * time.Millisecond
	addr := serveConns(t, func(c net.Conn) {
		type req struct {
			b  []byte
			at time.Time
		}
		reqs := make(chan req, 1024)
		var wg sync.WaitGroup
		wg.Go(func() {
			for r := range reqs {
				time.Sleep(time.Until(r.at.Add(delay)))
				if _, err := c.Write(r.b); err != nil {
					return
				}
			}
		})
		defer wg.Wait()
		defer close(reqs)
		for {
			b := make([]byte, size)
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			reqs <- req{b, time.Now()}
		}
	})
	d := dialer(t, load.DialConfig{Target: addr, Timeout: 5 * time.Second})
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Duration: 300 * time.Millisecond}, ReqSize: size, Raw: true, OpenRate: 200,
	})
	if err != nil {
		t.Fatal(err)
	}
	// 200/s for 0.3 s is 60 requests; a closed loop would manage 6.
	if rr.Sent != 60 || rr.Requests != 60 || rr.Missed != 0 || rr.Errors != 0 {
		t.Fatalf("open loop behind a slow server: %+v", rr)
	}
	if rr.Latency.P50 < float64(delay.Microseconds()) {
		t.Fatalf("p50 %.0f µs, below the server's %v delay", rr.Latency.P50, delay)
	}
}

// No coordinated omission: a server that stalls for 200 ms holds the
// writer up (MaxInFlight 2), and the requests it then sends late count from
// their scheduled time, so the stall shows in the latency of many requests,
// not of the few in flight when it began.
func TestOpenLoopCountsStallFromSchedule(t *testing.T) {
	const stall = 200 * time.Millisecond
	addr := serveConns(t, func(c net.Conn) {
		time.Sleep(stall)
		io.Copy(c, c)
	})
	d := dialer(t, load.DialConfig{Target: addr, Timeout: 5 * time.Second})
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Duration: 400 * time.Millisecond}, ReqSize: 8, Raw: true, OpenRate: 200, MaxInFlight: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rr.Requests != 80 || rr.Missed != 0 || rr.Errors != 0 {
		t.Fatalf("stalling server: %+v", rr)
	}
	// About a fifth of the 80 requests were due during the stall's first
	// 100 ms; counted from their actual send they would all look fast.
	if rr.Latency.P90 < 50_000 {
		t.Fatalf("p90 %.0f µs: the stall was not charged to the requests it delayed", rr.Latency.P90)
	}
}

// Bounded in count and time: against a server that never answers, at most
// MaxInFlight requests (and the one the reader waits on) go out, the run
// ends one timeout after the schedule, and what could not be sent counts as
// missed.
func TestOpenLoopBoundedAgainstSilentServer(t *testing.T) {
	addr := serveConns(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	d := dialer(t, load.DialConfig{Target: addr, Timeout: 300 * time.Millisecond})
	start := time.Now()
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Duration: 200 * time.Millisecond}, OpenRate: 1000, MaxInFlight: 4,
	})
	took := time.Since(start)
	if err == nil || rr == nil {
		t.Fatalf("silent server: %+v, %v; want an error", rr, err)
	}
	if rr.Requests != 0 || rr.Sent == 0 || rr.Sent > 5 || rr.Errors != 1 || rr.Unanswered != rr.Sent || rr.Missed != 200-rr.Sent {
		t.Fatalf("silent server: %+v", rr)
	}
	if took > 2*time.Second {
		t.Fatalf("run took %v, want about the schedule and one timeout", took)
	}
}

func TestOpenLoopRejects(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: "127.0.0.1:1"})
	for _, cfg := range []load.RRConfig{
		{Dialer: d, Bounds: load.Bounds{Count: 1}, OpenRate: 10, Rate: 10},
		{Dialer: d, Bounds: load.Bounds{Count: 1}, OpenRate: -1},
		{Dialer: d, Bounds: load.Bounds{Count: 1}, OpenRate: 10, MaxInFlight: load.MaxInFlight + 1},
		{Dialer: d, OpenRate: 10},
	} {
		if _, err := load.RR(context.Background(), cfg); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}
}

// Prime: every connection makes one round trip before the schedule, which
// the result does not count; the schedule's echoes still come back in
// order after it.
func TestOpenLoopPrime(t *testing.T) {
	const conns, count, size = 10, 100, 16
	var got atomic.Int64
	addr := serveConns(t, func(c net.Conn) {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			got.Add(1)
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	d := dialer(t, load.DialConfig{Target: addr})
	started := 0
	rr, err := load.RR(context.Background(), load.RRConfig{
		Dialer: d, Bounds: load.Bounds{Count: count}, Concurrency: conns, ReqSize: size, Raw: true, OpenRate: 1000,
		Prime: true, OnStart: func(n int) {
			started = n
			if served := got.Load(); served != conns {
				t.Errorf("%d requests served when the schedule starts, want one a connection (%d)", served, conns)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if started != conns || rr.Requests != count || rr.Errors != 0 || rr.Unanswered != 0 {
		t.Fatalf("primed open loop: started %d, %+v", started, rr)
	}
	if served := got.Load(); served != count+conns {
		t.Fatalf("server answered %d requests, want %d scheduled + %d priming", served, count, conns)
	}
}
