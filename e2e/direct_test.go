package e2e

import (
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// directConfig is ztunnel's direct-test world (src/test_helpers.rs
// local_xds_config) on one lab node "local": the source (the daemon under
// test, SOCKS5 on), an HBONE workload, a TCP workload, and a TCP workload
// known only by hostname; the service local-vip (10.96.0.1) is backed by
// the HBONE one, local-vip-async-dns (10.96.0.2) by the hostname one.
// Every port 80 maps to the echo servers' 8080.
const directConfig = `
workloads:
- uid: cluster1//v1/Pod/default/local-source
  name: source
  namespace: default
  serviceAccount: default
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: local
  services: {}
- uid: cluster1//v1/Pod/default/local-hbone
  name: hbone
  namespace: default
  serviceAccount: default
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: local
  services:
    default/local-vip.default.svc.cluster.local: {80: 8080}
- uid: cluster1//v1/Pod/default/local-tcp
  name: tcp
  namespace: default
  serviceAccount: default
  workloadIps: ["10.244.0.4"]
  protocol: TCP
  node: local
  services: {}
- uid: cluster1//v1/Pod/default/local-tcp-via-dns
  name: tcp-via-dns
  namespace: default
  serviceAccount: default
  hostname: tcp.reflect.internal
  workloadIps: []
  protocol: TCP
  node: local
  services:
    default/local-vip-async-dns.default.svc.cluster.local: {80: 8080}
services:
- name: local-vip
  namespace: default
  hostname: local-vip.default.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
- name: local-vip-async-dns
  namespace: default
  hostname: local-vip-async-dns.default.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
`

// directResolverIP is the resolver pod's address: the first pod after the
// three configured ones on node 0 (checked at start).
const directResolverIP = "10.244.0.5"

// directLab is one run of directConfig.
type directLab struct {
	c        *labrun.Cluster
	source   *labrun.Daemon
	echo     map[string]*labrun.EchoServer // by pod
	resolver *fakeResolver
}

// startDirectLab starts directConfig with SOCKS5 on and the resolver pod
// answering tcp.reflect.internal with the TCP workload's address (ztunnel's
// test DNS server "reflects" such names). node, when set, is every
// daemon's NODE_NAME (the _local variants); env adds to every daemon's
// environment (and wins over labrun's defaults).
func startDirectLab(t *testing.T, node string, env ...string) *directLab {
	t.Helper()
	lab := netnslab.New(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env = append([]string{"UNSTABLE_ENABLE_SOCKS5=true", "ZTUNNEL_RESOLV_CONF=" + writeResolvConf(t, dir, directResolverIP)}, env...)
	if node != "" {
		env = append(env, "NODE_NAME="+node)
	}
	c := startCluster(ctx, t, lab, directConfig, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: dir, DaemonEnv: env, ExtraPods: map[string][]string{"local": {"resolver"}},
	})
	if got := c.Pods["resolver"].IP.String(); got != directResolverIP {
		t.Fatalf("resolver pod got %s, the daemons were told %s", got, directResolverIP)
	}
	if _, ok := c.Daemons["tcp"]; ok {
		t.Fatal("the TCP workload got a daemon")
	}
	dl := &directLab{c: c, source: c.Daemons["source"], echo: map[string]*labrun.EchoServer{}}
	for _, pod := range []string{"hbone", "tcp"} {
		dl.echo[pod] = startEcho(t, c.Pods[pod], 8080)
	}
	dl.resolver = startResolver(t, c.Pods["resolver"], map[string]string{"tcp.reflect.internal.": c.Pods["tcp"].IP.String()})
	return dl
}

// socks5Connect opens a connection from the source pod's app through the
// daemon's SOCKS5 listener to target.
func (dl *directLab) socks5Connect(ctx context.Context, t *testing.T, target socks5.Target) *net.TCPConn {
	t.Helper()
	conn, err := dl.c.Pods["source"].Dial(ctx, "tcp", "127.0.0.1:15080")
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if rep, err := socks5.ClientHandshake(conn, target); err != nil {
		conn.Close()
		t.Fatalf("socks5 handshake to %+v: %v (reply %#x)", target, err, byte(rep))
	}
	return conn.(*net.TCPConn)
}

// directBody is what ztunnel's read_write_stream sends and wants back.
const directBody = "hello world"

// readWriteStream is ztunnel's read_write_stream: one write, the same
// bytes read back.
func readWriteStream(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte(directBody)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(directBody))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != directBody {
		t.Fatalf("echo %q, %v; want %q", got, err, directBody)
	}
}

// metricSum is the sum of a family's samples over every label set
// (ztunnel's query_sum with no labels).
func metricSum(fams map[string]*dto.MetricFamily, name string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// TestDirect runs ztunnel's tests/direct.rs request cases through a real
// daemon (rows 40-46 and 49 of docs/ztunnel-scenarios.md): an app in the
// source pod speaks SOCKS5 to its daemon, which carries the connection to
// an HBONE workload (over HBONE to that pod's daemon), a TCP workload, a
// service by VIP or hostname, or a service whose endpoint is known only by
// hostname (on-demand DNS, counted per connection). Each case runs with the
// daemons' node unset and set to the workloads' node (ztunnel's _local
// variants). Beyond ztunnel's echo, each case checks which pod the
// connection reached and from which source address.
func TestDirect(t *testing.T) {
	for _, variant := range []struct{ name, node string }{{"node unset", ""}, {"node set", "local"}} {
		t.Run(variant.name, func(t *testing.T) {
			dl := startDirectLab(t, variant.node)
			srcIP := dl.c.Pods["source"].IP
			cases := []struct {
				name   string
				target socks5.Target
				// conns connections are made; reaches is the pod whose echo
				// server must see each of them.
				conns   int
				reaches string
				// onDemandDNS is the istio_on_demand_dns_total increase.
				onDemandDNS float64
			}{
				{"hbone workload", socks5.Target{Addr: netip.MustParseAddrPort("10.244.0.3:8080")}, 1, "hbone", 0},
				{"tcp workload", socks5.Target{Addr: netip.MustParseAddrPort("10.244.0.4:8080")}, 1, "tcp", 0},
				{"service vip", socks5.Target{Addr: netip.MustParseAddrPort("10.96.0.1:80")}, 1, "hbone", 0},
				{"service hostname", socks5.Target{Host: "local-vip.default.svc.cluster.local", Port: 80}, 1, "hbone", 0},
				{"on-demand dns", socks5.Target{Addr: netip.MustParseAddrPort("10.96.0.2:80")}, 2, "tcp", 2},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					before := scrapeDaemon(ctx, t, dl.source)
					peersBefore := len(dl.echo[tc.reaches].Peers())
					for range tc.conns {
						conn := dl.socks5Connect(ctx, t, tc.target)
						readWriteStream(t, conn)
						conn.Close()
					}
					peers := dl.echo[tc.reaches].Peers()
					if len(peers) != peersBefore+tc.conns {
						t.Fatalf("%s's echo saw %d new connections, want %d", tc.reaches, len(peers)-peersBefore, tc.conns)
					}
					for _, p := range peers[peersBefore:] {
						if p.Addr() != srcIP {
							t.Errorf("%s's echo saw a connection from %s, want the source pod %s", tc.reaches, p.Addr(), srcIP)
						}
					}
					after := scrapeDaemon(ctx, t, dl.source)
					// ztunnel's process_metrics_assertions: one sample each, > 0.
					for _, name := range []string{"process_open_fds", "process_max_fds"} {
						ms := after[name].GetMetric()
						if len(ms) != 1 || ms[0].GetGauge().GetValue() <= 0 {
							t.Errorf("%s: %v, want one positive gauge", name, ms)
						}
					}
					const dnsFamily = "istio_on_demand_dns_total"
					if got := metricSum(after, dnsFamily) - metricSum(before, dnsFamily); got != tc.onDemandDNS {
						t.Errorf("%s rose by %v, want %v", dnsFamily, got, tc.onDemandDNS)
					}
					if tc.onDemandDNS > 0 {
						if n := len(after[dnsFamily].GetMetric()); n != 1 {
							t.Errorf("%s has %d series, want 1", dnsFamily, n)
						}
						if !slices.ContainsFunc(dl.resolver.Asked(), func(q string) bool { return q == srcIP.String()+" tcp.reflect.internal." }) {
							t.Errorf("the resolver was not asked for tcp.reflect.internal by the daemon: %v", dl.resolver.Asked())
						}
					}
				})
			}

			// ztunnel's test_tcp_connections_metrics: while one proxied
			// connection is open it is counted opened and not closed; once
			// it closes, closed. Counted from the daemon's values before
			// (every earlier connection has closed by then).
			t.Run("connection counters while open and after close", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				const opened, closed = "istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total"
				var base float64
				if !pollUntil(ctx, func() bool {
					f := scrapeDaemon(ctx, t, dl.source)
					base = metricSum(f, opened)
					return metricSum(f, closed) == base
				}) {
					t.Fatal("earlier connections never all counted closed")
				}
				conn := dl.socks5Connect(ctx, t, socks5.Target{Addr: netip.MustParseAddrPort("10.244.0.4:8080")})
				defer conn.Close()
				readWriteStream(t, conn)
				f := scrapeDaemon(ctx, t, dl.source)
				if o, c := metricSum(f, opened), metricSum(f, closed); o != base+1 || c != base {
					t.Fatalf("while open: opened %v, closed %v; want %v and %v", o, c, base+1, base)
				}
				conn.Close()
				var o, c float64
				if !pollUntil(ctx, func() bool {
					f := scrapeDaemon(ctx, t, dl.source)
					o, c = metricSum(f, opened), metricSum(f, closed)
					return c == base+1
				}) {
					t.Fatalf("after close: closed %v, want %v", c, base+1)
				}
				if o != base+1 {
					t.Fatalf("after close: opened %v, want %v", o, base+1)
				}
			})
		})
	}
}

// pollUntil calls cond every 50ms until it holds or ctx ends (at most
// 2000 tries), and reports whether it held.
func pollUntil(ctx context.Context, cond func() bool) bool {
	for range 2000 {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}
