package e2e

import (
	"context"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// Fault coverage elsewhere, so this file does not repeat it:
//   - an upstream reset reaching the client as ECONNRESET: TestDataPath
//     "reset from the server reaches the client" (an idle connection; the
//     shared-mode faults below reset one in the middle of a transfer);
//   - istiod restarts at the protocol level (resume by versions, only the
//     rejected resource re-sent) and NACK details: xdsclient
//     TestResumeAfterRestart, TestNackNamesRejectedAndAppliesTheRest;
//     conversion rejections: state/xdsconv TestPartialApply;
//   - a CA outage shorter than a certificate's life: mtls/caclient
//     TestIstioCAOutage, mtls TestStoreKeepsCertWhileRefreshFails and
//     TestStoreNeverReturnsExpired;
//   - a pod deleted through ZDS (Del), the CNI agent restarting, a graceful
//     daemon restart: TestSharedMode; SIGTERM drain: TestDrain.
// The tests here add the same faults against real daemons in the lab.

// cpLab is a dedicated-mode cluster on xDS and the Istio CA, both served
// from the node "cp" (as TestControlPlane builds it).
type cpLab struct {
	*controlPlane
	dp   *dataplane
	echo *labrun.EchoServer
}

func startCPLab(t *testing.T, env ...string) *cpLab {
	t.Helper()
	lab := netnslab.New(t)
	l := &cpLab{controlPlane: startControlPlane(t, lab)}
	for _, w := range []struct{ name, ip, node string }{
		{"client", "10.244.1.2", "node-a"}, {"other", "10.244.1.3", "node-a"}, {"server", "10.244.2.2", "node-b"},
	} {
		l.xds.Set(xdsconv.AddressType, "u-"+w.name, "1", xdsWorkload(w.name, w.ip, w.node))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, xdsTopology, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
		DaemonEnv: append(l.env(), env...),
	})
	l.dp = &dataplane{cluster: c}
	l.echo = startEcho(t, c.Pods["server"], 8080)
	return l
}

// tryEcho opens a connection from pod to the server and checks one round
// trip; the caller closes the connection it returns.
func (l *cpLab) tryEcho(pod, msg string) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialEcho(ctx, l.dp.cluster.Pods[pod], l.echo.Addr, msg)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// waitEcho retries tryEcho until it succeeds (the daemon may need a moment
// to recover), failing the test after a generous limit.
func (l *cpLab) waitEcho(t *testing.T, pod, msg string) *net.TCPConn {
	t.Helper()
	return waitDialEcho(t, l.dp.cluster.Pods[pod], l.echo.Addr, msg).(*net.TCPConn)
}

// TestControlPlaneFaults takes istiod away and brings it back, feeds it a
// bad resource, and keeps the CA down for longer than a certificate lives,
// with real daemons in the lab.
func TestControlPlaneFaults(t *testing.T) {
	// 6s certificates: refreshed from 3s on, expired 6s into a CA outage.
	const certTTL = 6 * time.Second
	l := startCPLab(t, "SECRET_TTL="+certTTL.String())
	c := l.dp.cluster
	long := l.waitEcho(t, "client", "before the faults")
	defer long.Close()

	t.Run("istiod outage keeps the last snapshot and resumes by versions", func(t *testing.T) {
		opened := l.xds.StreamsOpened()
		broken := func(d *labrun.Daemon) int { return strings.Count(d.Log(), "retrying in") } // ztunnel's warn: "XDS client ... retrying in"
		before := map[string]int{}
		for name, d := range c.Daemons {
			before[name] = broken(d)
		}
		l.xds.Down()
		for name, d := range c.Daemons {
			if !nettest.Until(20*time.Second, func() bool { return broken(d) != before[name] }) {
				t.Fatalf("daemon %s did not notice the outage", name)
			}
		}
		// The last snapshot keeps serving: the open connection and new ones.
		if err := nettest.RoundTrip(long, "during the outage"); err != nil {
			t.Fatalf("open connection during the istiod outage: %v", err)
		}
		for _, from := range []string{"client", "other"} {
			nc, err := l.tryEcho(from, "new during the outage")
			if err != nil {
				t.Fatalf("new connection from %s during the istiod outage: %v", from, err)
			}
			nc.Close()
		}

		ln, err := l.node.Listen("tcp", l.xdsAddr)
		if err != nil {
			t.Fatal(err)
		}
		l.xds.Up(ln)
		// Each daemon's new stream says what it holds, so istiod sends
		// nothing it already has.
		want := map[string]string{"u-client": "1", "u-other": "1", "u-server": "1"}
		resumed := map[int]bool{}
		for len(resumed) < len(c.Daemons) {
			r := l.xds.WaitRequest(func(r *xdstest.Request) bool {
				return r.Stream > opened && r.TypeUrl == xdsconv.AddressType && r.ResponseNonce == ""
			})
			if resumed[r.Stream] {
				continue
			}
			resumed[r.Stream] = true
			if !maps.Equal(r.InitialResourceVersions, want) {
				t.Errorf("stream %d resumed with initial_resource_versions %v, want %v", r.Stream, r.InitialResourceVersions, want)
			}
		}
		if err := nettest.RoundTrip(long, "after the outage"); err != nil {
			t.Fatalf("open connection after istiod returned: %v", err)
		}
	})

	t.Run("bad resource is NACKed and the rest applied", func(t *testing.T) {
		before := len(l.xds.AllRequests())
		bad := xdsWorkload("broken", "10.244.2.9", "node-b")
		bad.GetWorkload().Addresses = [][]byte{{10, 244, 2}} // 3 bytes: no IP
		l.xds.Update(xdsconv.AddressType, []*discoveryv3.Resource{
			xdstest.NewResource(t, "u-broken", "1", bad),
			xdstest.NewResource(t, "u-extra", "1", xdsWorkload("extra", "10.244.2.3", "node-b")),
		}, nil)
		nacked := map[int]string{}
		for len(nacked) < len(c.Daemons) {
			r := l.xds.WaitRequest(func(r *xdstest.Request) bool {
				return r.TypeUrl == xdsconv.AddressType && r.IsNack()
			})
			nacked[r.Stream] = r.ErrorDetail.GetMessage()
		}
		for stream, msg := range nacked {
			if !strings.Contains(msg, "u-broken") || strings.Contains(msg, "u-extra") {
				t.Errorf("stream %d NACK error_detail %q, want it to name u-broken only", stream, msg)
			}
		}
		if len(l.xds.AllRequests()) == before {
			t.Fatal("no request after the push")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for name, d := range c.Daemons {
			code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
			if err != nil || code != 200 {
				t.Fatalf("config_dump of %s: %d %v", name, code, err)
			}
			if !strings.Contains(string(body), "u-extra") || strings.Contains(string(body), "u-broken") {
				t.Errorf("daemon %s after the partial push: want u-extra applied and u-broken left out", name)
			}
		}
		if err := nettest.RoundTrip(long, "after the NACK"); err != nil {
			t.Fatalf("open connection after the NACK: %v", err)
		}
		nc, err := l.tryEcho("other", "new after the NACK")
		if err != nil {
			t.Fatalf("new connection after the NACK: %v", err)
		}
		nc.Close()
	})

	t.Run("CA down for longer than a certificate lives", func(t *testing.T) {
		l.ca.SetFailing(status.Error(codes.Unavailable, "istiod is down"))
		ctx, cancel := context.WithTimeout(context.Background(), 4*certTTL)
		defer cancel()
		// The refresh fails and, once the certificate has expired, the
		// daemon says so.
		line, err := c.Daemons["client"].WaitLog(ctx, "warn", "certificate refresh failed", "has expired", "istiod is down")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("client's daemon: %s", line)
		// A connection opened before the outage keeps its TLS session.
		if err := nettest.RoundTrip(long, "with an expired certificate"); err != nil {
			t.Logf("the connection opened before the outage ended with it: %v", err)
		}
		// New connections fail, with a clear reason in the log and the
		// metrics.
		nc, err := l.tryEcho("client", "needs a certificate")
		if err == nil {
			nc.Close()
			t.Fatal("a new connection went through with the CA down and the certificate expired")
		}
		line, err = c.Daemons["client"].WaitLog(ctx, "connection complete", "certificate for spiffe://cluster.local/ns/default/sa/client")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("refused connection: %s", line)
		fams := l.dp.scrape(t, "client")
		if n := sum(fams, "istio_tcp_connections_opened_total", map[string]string{"response_flags": "IDENTITY_ERROR"}) +
			sum(fams, "istio_tcp_connections_closed_total", map[string]string{"response_flags": "IDENTITY_ERROR"}); n == 0 {
			t.Error("no connection counted with response_flags IDENTITY_ERROR")
		}

		l.ca.SetFailing(nil)
		nc = l.waitEcho(t, "client", "after the CA returned")
		nc.Close()
	})
}
