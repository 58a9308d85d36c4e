package load_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t *testing.T, cfg load.ServerConfig) string {
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error { return load.NewServer(cfg).Serve(ctx, ln) })
}

func dialer(t *testing.T, cfg load.DialConfig) *load.Dialer {
	t.Helper()
	d, err := load.NewDialer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

type pki struct {
	server, client *mtls.WorkloadCert
	serverSAN      string
}

func newPKI(t *testing.T) pki {
	ca := tlstest.NewCA(t, "")
	sid := identity.New("", "bench", "server")
	return pki{
		server: tlstest.Cert(t, ca, sid), client: tlstest.Cert(t, ca, identity.New("", "bench", "zload")),
		serverSAN: sid.String(),
	}
}

// startTLSServer terminates mTLS in front of the load server.
func startTLSServer(t *testing.T, p pki) string {
	cfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return p.server, nil })
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return load.NewServer(load.ServerConfig{}).Serve(ctx, tls.NewListener(ln, cfg))
	})
}

// startHBONEServer serves HBONE with our hbone.Server and forwards every
// CONNECT to its authority, as the daemon's inbound does.
func startHBONEServer(t *testing.T, p pki) string {
	cfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return p.server, nil })
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		var wg sync.WaitGroup
		srv := hbone.NewServer(hbone.Config{}, func(ctx context.Context, req *hbone.ServerRequest) {
			up, err := net.Dial("tcp", req.Authority)
			if err != nil {
				req.Respond(http.StatusServiceUnavailable, nil)
				return
			}
			s, err := req.Respond(http.StatusOK, nil)
			if err != nil {
				up.Close()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				relay(s, up.(*net.TCPConn))
			}()
		})
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		for {
			c, err := ln.Accept()
			if err != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = srv.ServeConn(ctx, tls.Server(c, cfg))
			}()
		}
		srv.Close()
		wg.Wait()
		return nil
	})
}

// relay copies both ways; an error either way closes both.
func relay(s *hbone.Stream, up *net.TCPConn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(up, s); err != nil {
			s.Close()
			up.Close()
			return
		}
		up.CloseWrite()
	}()
	if _, err := io.Copy(s, up); err != nil {
		s.Close()
		up.Close()
	} else {
		s.CloseWrite()
	}
	<-done
	s.Close()
	up.Close()
}

func TestModes(t *testing.T) {
	p := newPKI(t)
	sink := startServer(t, load.ServerConfig{})
	cases := []struct {
		name string
		cfg  load.DialConfig
	}{
		{"tcp", load.DialConfig{Target: sink}},
		{"tls", load.DialConfig{Target: startTLSServer(t, p), Transport: load.TLS, Cert: p.client, SANs: []string{p.serverSAN}}},
		{"hbone", load.DialConfig{Target: startHBONEServer(t, p), Transport: load.HBONE, Authority: sink, Cert: p.client, SANs: []string{p.serverSAN}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := dialer(t, tc.cfg)
			tp, err := load.Throughput(ctx, load.ThroughputConfig{Dialer: d, Duration: 100 * time.Millisecond, Concurrency: 3, WriteSize: 64 << 10})
			if err != nil {
				t.Fatalf("throughput: %v", err)
			}
			if tp.Streams != 3 || tp.Bytes == 0 || !tp.Acked || tp.Gbps <= 0 || len(tp.StreamGbps) != 3 {
				t.Fatalf("throughput: %+v", tp)
			}
			rr, err := load.RR(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 200}, Concurrency: 2, ReqSize: 10, RespSize: 70000})
			if err != nil {
				t.Fatalf("rr: %v", err)
			}
			if rr.Requests != 200 || rr.Errors != 0 || rr.Latency.P50 <= 0 || rr.Latency.Max < rr.Latency.P99 || rr.Latency.P99 < rr.Latency.P50 {
				t.Fatalf("rr: %+v", rr)
			}
			cps, err := load.CPS(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 30}, Concurrency: 3, RespSize: 100})
			if err != nil {
				t.Fatalf("cps: %v", err)
			}
			if cps.Requests != 30 || cps.Errors != 0 || cps.PerSecond <= 0 {
				t.Fatalf("cps: %+v", cps)
			}
		})
	}
}

func TestRRDurationAndRate(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: startServer(t, load.ServerConfig{})})
	rr, err := load.RR(context.Background(), load.RRConfig{Dialer: d, Bounds: load.Bounds{Duration: 300 * time.Millisecond}, Rate: 200, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	// 200/s for 0.3 s: about 60, never more than the schedule allows.
	if rr.Requests == 0 || rr.Requests > 62 || rr.Rate != 200 {
		t.Fatalf("rate-limited rr: %+v", rr)
	}
	cps, err := load.CPS(context.Background(), load.RRConfig{Dialer: d, Bounds: load.Bounds{Duration: 200 * time.Millisecond}})
	if err != nil || cps.Requests == 0 || cps.Errors != 0 {
		t.Fatalf("cps by duration: %+v, %v", cps, err)
	}
}

func TestRawAgainstEchoServer(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: startServer(t, load.ServerConfig{Raw: true})})
	ctx := context.Background()
	rr, err := load.RR(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 50}, ReqSize: 300, RespSize: 5, Raw: true})
	if err != nil || rr.Requests != 50 || rr.RespSize != 300 {
		t.Fatalf("raw rr: %+v, %v", rr, err)
	}
	tp, err := load.Throughput(ctx, load.ThroughputConfig{Dialer: d, Duration: 50 * time.Millisecond, Raw: true})
	if err != nil || tp.Acked || tp.Bytes == 0 {
		t.Fatalf("raw throughput: %+v, %v", tp, err)
	}
	cps, err := load.CPS(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 10}, Raw: true})
	if err != nil || cps.Requests != 10 {
		t.Fatalf("raw cps: %+v, %v", cps, err)
	}
}

func TestIdle(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: startServer(t, load.ServerConfig{})})
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	ps := httptest.NewServer(mux)
	defer ps.Close()
	held := 0
	res, err := load.Idle(context.Background(), load.IdleConfig{
		Dialer: d, Count: 200, Steps: 4, Pids: []int{os.Getpid()},
		GoroutineURLs: []string{ps.URL + "/debug/pprof/goroutine?debug=1"},
		// Sockets of earlier tests may still be closing: a longer settle and
		// more connections keep them from skewing the per-connection slope.
		Settle: 50 * time.Millisecond, Hold: time.Millisecond, OnHold: func(n int) { held = n },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Connections != 200 || len(res.Samples) != 5 || held != 200 {
		t.Fatalf("idle: %d connections, %d samples, held %d", res.Connections, len(res.Samples), held)
	}
	for i, s := range res.Samples {
		if s.Conns != 50*i || len(s.Procs) != 1 || len(s.Goroutines) != 1 {
			t.Fatalf("sample %d: %+v", i, s)
		}
	}
	// This process is both ends: each connection is two sockets here, and
	// the server holds a goroutine for each.
	if pc := res.PerConn[0]; pc.FDs < 1.9 || pc.FDs > 2.1 {
		t.Fatalf("fds per connection %v, want 2", pc.FDs)
	}
	if g := res.GoroutinesPerConn[0]; g < 0.9 {
		t.Fatalf("goroutines per connection %v, want at least the server's 1", g)
	}
}

func TestBounds(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: "127.0.0.1:1"})
	ctx := context.Background()
	if _, err := load.RR(ctx, load.RRConfig{Dialer: d}); !errors.Is(err, load.ErrUnbounded) {
		t.Fatalf("rr with no bounds: %v", err)
	}
	if _, err := load.CPS(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Duration: 2 * load.MaxDuration}}); err == nil {
		t.Fatal("cps longer than the maximum was accepted")
	}
	if _, err := load.Throughput(ctx, load.ThroughputConfig{Dialer: d}); !errors.Is(err, load.ErrUnbounded) {
		t.Fatalf("throughput with no duration: %v", err)
	}
	if _, err := load.Idle(ctx, load.IdleConfig{Dialer: d, Count: load.MaxIdleConns + 1}); err == nil {
		t.Fatal("idle above the maximum was accepted")
	}
	if _, err := load.RR(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 1}, Concurrency: load.MaxConcurrency + 1}); err == nil {
		t.Fatal("concurrency above the maximum was accepted")
	}
}

func TestDialerChecks(t *testing.T) {
	p := newPKI(t)
	for _, cfg := range []load.DialConfig{
		{},
		{Target: "no-port"},
		{Target: "127.0.0.1:1", Transport: load.TLS},
		{Target: "127.0.0.1:1", Transport: load.HBONE, Cert: p.client, SANs: []string{p.serverSAN}},
		{Target: "127.0.0.1:1", Transport: load.TLS, Cert: p.client},
		{Target: "127.0.0.1:1", Transport: "quic"},
	} {
		if d, err := load.NewDialer(cfg); err == nil {
			d.Close()
			t.Errorf("NewDialer(%+v) accepted", cfg)
		}
	}
}

func TestWrongServerIdentityFails(t *testing.T) {
	p := newPKI(t)
	d := dialer(t, load.DialConfig{Target: startTLSServer(t, p), Transport: load.TLS, Cert: p.client,
		SANs: []string{"spiffe://cluster.local/ns/bench/sa/other"}})
	if _, err := load.RR(context.Background(), load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 1}}); !errors.Is(err, mtls.ErrIdentityMismatch) {
		t.Fatalf("rr to a server with another identity: %v, want %v", err, mtls.ErrIdentityMismatch)
	}
}

func TestServerRejectsBadHeader(t *testing.T) {
	addr := startServer(t, load.ServerConfig{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("server answered a bad header: %d bytes, %v", n, err)
	}
}
