package peers_test

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/peers"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startSink(t *testing.T) string {
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return load.NewServer(load.ServerConfig{}).Serve(ctx, ln)
	})
}

// exercise runs every load mode briefly through d.
func exercise(t *testing.T, d *load.Dialer) {
	t.Helper()
	ctx := context.Background()
	tp, err := load.Throughput(ctx, load.ThroughputConfig{Dialer: d, Duration: 100 * time.Millisecond, Concurrency: 2})
	if err != nil {
		t.Fatalf("throughput: %v", err)
	}
	if tp.Bytes == 0 || !tp.Acked {
		t.Fatalf("throughput: %+v", tp)
	}
	rr, err := load.RR(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 50}, ReqSize: 100, RespSize: 20000})
	if err != nil || rr.Requests != 50 {
		t.Fatalf("rr: %+v, %v", rr, err)
	}
	cps, err := load.CPS(ctx, load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 20}, Concurrency: 2})
	if err != nil || cps.Requests != 20 || cps.Errors != 0 {
		t.Fatalf("cps: %+v, %v", cps, err)
	}
}

type pki struct {
	server, client *mtls.WorkloadCert
	serverID       string
}

func newPKI(t *testing.T) pki {
	ca := tlstest.NewCA(t, "")
	sid := identity.New("", "bench", "server")
	return pki{
		server:   tlstest.Cert(t, ca, sid),
		client:   tlstest.Cert(t, ca, identity.New("", "bench", "client")),
		serverID: sid.String(),
	}
}

func newDialer(t *testing.T, cfg load.DialConfig) *load.Dialer {
	t.Helper()
	d, err := load.NewDialer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestCopy(t *testing.T) {
	sink := startSink(t)
	proxy := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error { return peers.Copy(ctx, ln, sink, peers.Config{}) })
	exercise(t, newDialer(t, load.DialConfig{Target: proxy}))
}

func TestTLS(t *testing.T) {
	p := newPKI(t)
	sink := startSink(t)
	proxy := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.TLS(ctx, ln, sink, p.server, peers.Config{})
	})
	exercise(t, newDialer(t, load.DialConfig{Target: proxy, Transport: load.TLS, Cert: p.client, SANs: []string{p.serverID}}))
}

func TestH2ServerWithOurHBONEClient(t *testing.T) {
	p := newPKI(t)
	sink := startSink(t)
	proxy := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Server(ctx, ln, p.server, peers.Config{})
	})
	exercise(t, newDialer(t, load.DialConfig{
		Target: proxy, Transport: load.HBONE, Authority: sink, Cert: p.client, SANs: []string{p.serverID},
	}))
}

func TestH2Pair(t *testing.T) {
	p := newPKI(t)
	sink := startSink(t)
	server := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Server(ctx, ln, p.server, peers.Config{})
	})
	client := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Client(ctx, ln, server, sink, p.client, []string{p.serverID}, peers.Config{})
	})
	exercise(t, newDialer(t, load.DialConfig{Target: client}))
}

func TestH2ClientRefusesWrongServerIdentity(t *testing.T) {
	p := newPKI(t)
	sink := startSink(t)
	server := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Server(ctx, ln, p.server, peers.Config{})
	})
	client := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Client(ctx, ln, server, sink, p.client, []string{"spiffe://cluster.local/ns/bench/sa/other"}, peers.Config{})
	})
	d := newDialer(t, load.DialConfig{Target: client, Timeout: 5 * time.Second})
	if _, err := load.RR(context.Background(), load.RRConfig{Dialer: d, Bounds: load.Bounds{Count: 1}}); err == nil {
		t.Fatal("a request went through a server with the wrong identity")
	}
}
