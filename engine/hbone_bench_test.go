package engine_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/hbone/hbonetest"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// The two-hop HBONE path in one process, as two daemons run it: a TCP
// client → engine (client side) → HBONE stream over mTLS → engine (server
// side) → TCP server. Each side has its own engine, as each daemon does.
// Run side by side:
//
//	go test -run '^$' -bench HBONETwoHops -benchtime 2s ./engine

// hboneRig is one two-hop path: a TCP front listener (the client pod's
// captured connections), a client engine and hbone.ClientConn, a TLS
// hbone.Server whose handler relays to the back listener through the
// server engine.
type hboneRig struct {
	cli, srv   *engine.Engine
	front, bck *net.TCPListener
	cc         *hbone.ClientConn
	hs         *hbone.Server
	tln        net.Listener
	wg         sync.WaitGroup
}

// cpuTime is the process's user and system CPU time so far, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func newHBONERig(b *testing.B, backend string) *hboneRig {
	srvTLS, cliTLS := hbonetest.SelfSignedTLS(b)
	// As the daemon: no tickets, so mtls/record keeps the records.
	srvTLS.SessionTicketsDisabled = true
	r := &hboneRig{}
	var err error
	if r.cli, err = engine.New(engine.Config{Backend: backend}); err != nil {
		b.Fatal(err)
	}
	if r.srv, err = engine.New(engine.Config{Backend: backend}); err != nil {
		b.Fatal(err)
	}
	if r.front, err = net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		b.Fatal(err)
	}
	if r.bck, err = net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		b.Fatal(err)
	}
	bckAddr := r.bck.Addr().(*net.TCPAddr)
	r.hs = hbone.NewServer(hbone.Config{MaxStreams: 1 << 16}, func(_ context.Context, req *hbone.ServerRequest) {
		up, err := net.DialTCP("tcp", nil, bckAddr)
		if err != nil {
			_, _ = req.Respond(http.StatusServiceUnavailable, nil)
			return
		}
		up.SetNoDelay(true)
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			up.Close()
			return
		}
		r.srv.Start(hboneEndpoint{s}, engine.TCPEndpoint{TCPConn: up}, nil, func(engine.Result) {})
	})
	if r.tln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	r.wg.Go(func() {
		for {
			nc, err := r.tln.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() {
				tc := record.Server(nc, srvTLS)
				if err := tc.Handshake(); err != nil {
					nc.Close()
					return
				}
				_ = r.hs.ServeConn(context.Background(), tc)
			})
		}
	})
	nc, err := net.Dial("tcp", r.tln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	tc := record.Client(nc, cliTLS)
	if err := tc.Handshake(); err != nil {
		b.Fatal(err)
	}
	if r.cc, err = hbone.NewClientConn(tc, hbone.Config{MaxStreams: 1 << 16}); err != nil {
		b.Fatal(err)
	}
	return r
}

func (r *hboneRig) close() {
	r.cc.Close()
	r.tln.Close()
	r.hs.Close()
	r.wg.Wait()
	r.front.Close()
	r.bck.Close()
	r.cli.Close()
	r.srv.Close()
}

// connect opens one client→server path through both engines.
func (r *hboneRig) connect(b *testing.B) benchConn {
	client, err := net.DialTCP("tcp", nil, r.front.Addr().(*net.TCPAddr))
	if err != nil {
		b.Fatal(err)
	}
	client.SetNoDelay(true)
	a, err := r.front.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	a.SetNoDelay(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := r.cc.Connect(ctx, &hbone.Request{Authority: "10.0.0.1:80"})
	if err != nil {
		b.Fatal(err)
	}
	server, err := r.bck.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	server.SetNoDelay(true)
	done := make(chan engine.Result, 1)
	r.cli.Start(engine.TCPEndpoint{TCPConn: a}, hboneEndpoint{s}, nil, func(res engine.Result) { done <- res })
	return benchConn{client: client, server: server, done: done}
}

// BenchmarkHBONETwoHops streams client→server on 1 and 8 connections
// (MB/s) and runs a 1-byte request/response (ns/op) through two engines
// and one HBONE connection, for each relay backend.
func BenchmarkHBONETwoHops(b *testing.B) {
	// "epoll-copy" is epoll with the stream→socket direction copying
	// through a relay buffer (TryRead) instead of writing from the
	// stream's own buffer (Peek).
	for _, variant := range []string{engine.BackendStd, engine.BackendEpoll, "epoll-copy"} {
		backend := strings.TrimSuffix(variant, "-copy")
		setup := func(rig *hboneRig) {
			engine.SetNoPeek(rig.cli, variant != backend)
			engine.SetNoPeek(rig.srv, variant != backend)
		}
		for _, streams := range []int{1, 8} {
			b.Run(variant+"/tput"+map[int]string{1: "1", 8: "8"}[streams], func(b *testing.B) {
				rig := newHBONERig(b, backend)
				setup(rig)
				defer rig.close()
				conns := make([]benchConn, streams)
				var drain sync.WaitGroup
				for i := range conns {
					conns[i] = rig.connect(b)
					srv := conns[i].server
					drain.Go(func() {
						// Large reads (io.Discard would read 8 KiB at a
						// time), so the sink's syscalls do not dominate.
						buf := make([]byte, 256<<10)
						for {
							if _, err := srv.Read(buf); err != nil {
								return
							}
						}
					})
				}
				buf := make([]byte, 128<<10)
				b.SetBytes(int64(len(buf) * streams))
				b.ReportAllocs()
				work := make(chan struct{}, streams)
				var writers sync.WaitGroup
				for _, c := range conns {
					writers.Go(func() {
						for range work {
							if _, err := c.client.Write(buf); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				cpu0 := cpuTime()
				for b.Loop() {
					for range streams {
						work <- struct{}{}
					}
				}
				close(work)
				writers.Wait()
				// CPU per byte is steadier than MB/s on a shared machine: it
				// counts the whole process (load, both relays, TLS).
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*len(buf)*streams)*(1<<20)/1e3, "cpu-us/MiB")
				for _, c := range conns {
					c.client.CloseWrite()
				}
				drain.Wait()
				for _, c := range conns {
					c.close()
				}
			})
		}
		b.Run(variant+"/rr", func(b *testing.B) {
			rig := newHBONERig(b, backend)
			setup(rig)
			defer rig.close()
			c := rig.connect(b)
			defer c.close()
			go echoBytes(c.server)
			one := make([]byte, 1)
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				c.client.Write(one)
				if _, err := io.ReadFull(c.client, one); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e3, "cpu-us/op")
		})
	}
}

// BenchmarkHBONEIdleRelays holds IDLE_RELAYS (default 2000) idle two-hop
// paths, each after a 1-byte exchange both ways, and reports their heap
// per path: both engines' relays, both HBONE streams and the four sockets
// the benchmark itself holds. With -memprofile and -memprofilerate 1 the
// profile's inuse_space tells the allocation sites.
func BenchmarkHBONEIdleRelays(b *testing.B) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("IDLE_RELAYS")); err == nil && v > 0 {
		n = v
	}
	raiseFDLimit(8*n + 1024)
	for b.Loop() {
		rig := newHBONERig(b, engine.BackendEpoll)
		before := measure()
		conns := make([]benchConn, n)
		one := make([]byte, 1)
		for i := range conns {
			c := rig.connect(b)
			conns[i] = c
			c.client.Write(one)
			io.ReadFull(c.server, one)
			c.server.Write(one)
			io.ReadFull(c.client, one)
		}
		after := measure()
		if path := os.Getenv("IDLE_HEAP_PROFILE"); path != "" {
			// The live heap while the paths are idle, by allocation site.
			if f, err := os.Create(path); err == nil {
				_ = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
		}
		per := func(x, y int64) float64 { return float64(y-x) / float64(n) }
		b.ReportMetric(per(before.heap, after.heap), "heap-B/path")
		b.ReportMetric(per(before.rss, after.rss), "rss-B/path")
		b.ReportMetric(per(before.goroutines, after.goroutines), "goroutines/path")
		for _, c := range conns {
			c.close()
		}
		rig.close()
	}
}
