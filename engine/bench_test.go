package engine_test

import (
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
)

// Run side by side, in one process, so ratios compare like with like:
//
//	go test -run '^$' -bench . -benchtime 2s ./engine
//
// "direct" is the same traffic on one TCP connection with no relay: the
// limit a relay can approach.

// benchBackends are the relay backends this machine can run, plus "direct".
func benchBackends(b *testing.B) []string {
	names := []string{"direct", engine.BackendStd, engine.BackendEpoll, "epoll-locked"}
	if e, err := engine.New(engine.Config{Backend: engine.BackendUring}); err == nil {
		e.Close()
		names = append(names, engine.BackendUring)
	} else {
		b.Logf("io_uring not measured: %v", err)
	}
	return names
}

// benchConn is one client→server path: direct, or through a relay.
type benchConn struct {
	client, server *net.TCPConn
	done           chan engine.Result
}

type benchRig struct {
	e          *engine.Engine
	front, bck *net.TCPListener
}

func newBenchRig(b *testing.B, backend string) *benchRig {
	r := &benchRig{}
	var err error
	if backend != "direct" {
		cfg := engine.Config{Backend: backend}
		if name, ok := strings.CutSuffix(backend, "-locked"); ok {
			cfg = engine.Config{Backend: name, LockOSThread: true}
		}
		if r.e, err = engine.New(cfg); err != nil {
			b.Fatal(err)
		}
	}
	if r.front, err = net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		b.Fatal(err)
	}
	if r.bck, err = net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		b.Fatal(err)
	}
	return r
}

func (r *benchRig) close() {
	r.front.Close()
	r.bck.Close()
	if r.e != nil {
		r.e.Close()
	}
}

// connect opens one path; through a relay it does what the proxy does:
// accept, dial the destination, hand both sockets to the engine.
func (r *benchRig) connect(b *testing.B) benchConn {
	client, a := dialAccept(b, r.front)
	if r.e == nil {
		return benchConn{client: client, server: a}
	}
	bb, server := dialAccept(b, r.bck)
	for _, c := range []*net.TCPConn{a, bb} {
		c.SetNoDelay(true)
	}
	done := make(chan engine.Result, 1)
	r.e.Start(engine.TCPEndpoint{TCPConn: a}, engine.TCPEndpoint{TCPConn: bb}, nil, func(res engine.Result) { done <- res })
	return benchConn{client: client, server: server, done: done}
}

// dialAccept connects to ln and returns both ends.
func dialAccept(b *testing.B, ln *net.TCPListener) (dialed, accepted *net.TCPConn) {
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	return c, s
}

// echoBytes sends back each byte c receives, one at a time, until c fails:
// the server of a round-trip benchmark.
func echoBytes(c *net.TCPConn) {
	one := make([]byte, 1)
	for {
		if _, err := c.Read(one); err != nil {
			return
		}
		if _, err := c.Write(one); err != nil {
			return
		}
	}
}

func (c benchConn) close() {
	c.client.Close()
	c.server.Close()
	if c.done != nil {
		<-c.done
	}
}

// BenchmarkRelayThroughput streams one connection client→server; MB/s is
// the relay's throughput on loopback (the writer and reader share the
// machine with the relay, as in the daemon's pod).
func BenchmarkRelayThroughput(b *testing.B) {
	for _, name := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			rig := newBenchRig(b, name)
			defer rig.close()
			c := rig.connect(b)
			defer c.close()
			drained := make(chan int64)
			go func() {
				n, _ := io.Copy(io.Discard, c.server)
				drained <- n
			}()
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.client.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.client.CloseWrite()
			<-drained
		})
	}
}

// BenchmarkRelayRoundTrip is a 1-byte request/response through the relay:
// ns/op is the round-trip latency.
func BenchmarkRelayRoundTrip(b *testing.B) {
	for _, name := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			rig := newBenchRig(b, name)
			defer rig.close()
			c := rig.connect(b)
			defer c.close()
			c.client.SetNoDelay(true)
			c.server.SetNoDelay(true)
			go echoBytes(c.server)
			one := make([]byte, 1)
			b.ReportAllocs()
			for b.Loop() {
				c.client.Write(one)
				if _, err := io.ReadFull(c.client, one); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelaySetup opens a connection through the relay, exchanges one
// byte each way and closes it: the per-connection cost of the handoff.
func BenchmarkRelaySetup(b *testing.B) {
	for _, name := range benchBackends(b) {
		b.Run(name, func(b *testing.B) {
			rig := newBenchRig(b, name)
			defer rig.close()
			one := make([]byte, 1)
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				c := rig.connect(b)
				c.client.Write(one)
				io.ReadFull(c.server, one)
				c.server.Write(one)
				io.ReadFull(c.client, one)
				c.close()
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
		})
	}
}

// BenchmarkIdleRelays holds many idle relays (IDLE_RELAYS, default 10,000,
// fewer if the descriptor limit cannot hold them: each costs this process 4
// sockets, plus 2 pipes on the std backend) and reports what each costs the
// process: heap and goroutine stacks, RSS, descriptors and goroutines. The
// peers' own sockets are opened before the baseline, so only the relay's
// share is counted.
func BenchmarkIdleRelays(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("IDLE_RELAYS")); err == nil && v > 0 {
		n = v
	}
	if limit := raiseFDLimit(8*n + 1024); limit < 8*n+1024 {
		n = (limit - 1024) / 8
		b.Logf("descriptor limit %d: measuring %d idle relays", limit, n)
	}
	for _, name := range benchBackends(b) {
		if name == "direct" {
			continue
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				rig := newBenchRig(b, name)
				type quad struct{ client, a, bb, server *net.TCPConn }
				quads := make([]quad, n)
				for i := range quads {
					q := &quads[i]
					var err error
					if q.client, err = net.DialTCP("tcp", nil, rig.front.Addr().(*net.TCPAddr)); err != nil {
						b.Fatal(err)
					}
					if q.a, err = rig.front.AcceptTCP(); err != nil {
						b.Fatal(err)
					}
					if q.bb, err = net.DialTCP("tcp", nil, rig.bck.Addr().(*net.TCPAddr)); err != nil {
						b.Fatal(err)
					}
					if q.server, err = rig.bck.AcceptTCP(); err != nil {
						b.Fatal(err)
					}
				}
				before := measure()
				done := make(chan engine.Result, n)
				one := make([]byte, 1)
				for _, q := range quads {
					rig.e.Start(engine.TCPEndpoint{TCPConn: q.a}, engine.TCPEndpoint{TCPConn: q.bb}, nil, func(r engine.Result) { done <- r })
					// One byte through each, so every relay has run once.
					q.client.Write(one)
					io.ReadFull(q.server, one)
				}
				// Let the loops return the pipes and settle.
				for st := rig.e.Stats(); st.PipesInUse > 0; st = rig.e.Stats() {
					time.Sleep(time.Millisecond)
				}
				after := measure()
				per := func(x, y int64) float64 { return float64(y-x) / float64(n) }
				b.ReportMetric(per(before.heap, after.heap), "heap-B/relay")
				b.ReportMetric(per(before.rss, after.rss), "rss-B/relay")
				b.ReportMetric(per(before.fds, after.fds), "fds/relay")
				b.ReportMetric(per(before.goroutines, after.goroutines), "goroutines/relay")
				for _, q := range quads {
					q.client.Close()
					q.server.Close()
				}
				for range n {
					<-done
				}
				rig.close()
			}
		})
	}
}

type usage struct{ heap, rss, fds, goroutines int64 }

func measure() usage {
	// Collect, let finalizers close what the previous run left (the std
	// relay's pooled pipes), collect again and give free pages back, so
	// heap and RSS count live memory only.
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := usage{heap: int64(ms.HeapInuse + ms.StackInuse), goroutines: int64(runtime.NumGoroutine())}
	if s, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(s)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			u.rss = pages * int64(os.Getpagesize())
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		u.fds = int64(len(ents))
	}
	return u
}

// raiseFDLimit lifts RLIMIT_NOFILE towards want (as far as the hard limit,
// or beyond it when privileged) and returns the limit in force.
func raiseFDLimit(want int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	if lim.Cur >= uint64(want) {
		return int(lim.Cur)
	}
	up := lim
	up.Cur = uint64(want)
	if up.Max < up.Cur {
		up.Max = up.Cur
	}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up) == nil {
		return want
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return int(lim.Cur)
}
