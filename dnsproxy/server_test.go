package dnsproxy

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"

	"github.com/ztunnel-go/ztunnel/metrics"
)

func started(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Addrs == nil {
		cfg.Addrs = []string{"127.0.0.1:0"}
	}
	s := newServer(t, cfg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func exchange(t *testing.T, network, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", network, m.Question[0].Name, err)
	}
	return resp
}

// TestServeUDPAndTCP: the same port answers over both transports, several
// queries on one TCP connection included.
func TestServeUDPAndTCP(t *testing.T) {
	up := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
	s := started(t, Config{Upstreams: []string{up.Addr}})
	addr := s.UDPAddrs()[0].String()
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			if got := records(exchange(t, network, addr, query("productpage", dns.TypeA)).Answer); !slices.Equal(got, []string{"productpage. A 9.9.9.9"}) {
				t.Fatalf("local answer %q", got)
			}
			if got := records(exchange(t, network, addr, query("www.bing.com", dns.TypeA)).Answer); !slices.Equal(got, []string{"www.bing.com. A 8.8.8.8"}) {
				t.Fatalf("forwarded answer %q", got)
			}
		})
	}
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, name := range []string{"productpage.", "example.ns2.", "dual.localhost."} {
		if err := c.WriteMsg(query(name, dns.TypeA)); err != nil {
			t.Fatal(err)
		}
		resp, err := c.ReadMsg()
		if err != nil || len(resp.Answer) != 1 {
			t.Fatalf("%s on a reused connection: %v %v", name, resp, err)
		}
	}
}

// TestForwardFailures: what the client gets when upstream fails, and that
// the next upstream is tried.
func TestForwardFailures(t *testing.T) {
	good := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
	// A UDP port nobody reads: queries sent there get no answer.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tests := []struct {
		name      string
		upstreams []string
		rcode     int
	}{
		{"no upstream", nil, dns.RcodeServerFailure},
		{"upstream that never answers", []string{silent.LocalAddr().String()}, dns.RcodeServerFailure},
		{"next upstream after a silent one", []string{silent.LocalAddr().String(), good.Addr}, dns.RcodeSuccess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, Config{Upstreams: tc.upstreams, UpstreamTimeout: 200 * time.Millisecond})
			if resp := ask(t, s, query("www.bing.com", dns.TypeA), false); resp.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tc.rcode])
			}
		})
	}
}

// TestDeadUpstreamTriedLast: once the first upstream has failed, the
// next queries go to the one that answers first, so a dead upstream does
// not hold every forwarded query for its timeout; a lone dead one is still
// asked.
func TestDeadUpstreamTriedLast(t *testing.T) {
	good := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer silent.Close()
	wg.Go(func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := silent.ReadFrom(buf); err != nil {
				return
			}
			asked.Add(1)
		}
	})
	s := newServer(t, Config{Upstreams: []string{silent.LocalAddr().String(), good.Addr}, UpstreamTimeout: 200 * time.Millisecond})
	for i := range 5 {
		if got := records(ask(t, s, query("www.bing.com", dns.TypeA), i%2 == 1).Answer); !slices.Equal(got, []string{"www.bing.com. A 8.8.8.8"}) {
			t.Fatalf("query %d: %q", i, got)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("the dead upstream was asked %d times, want once", n)
	}
	alone := newServer(t, Config{Upstreams: []string{silent.LocalAddr().String()}, UpstreamTimeout: 200 * time.Millisecond})
	for range 2 {
		if resp := ask(t, alone, query("www.bing.com", dns.TypeA), false); resp.Rcode != dns.RcodeServerFailure {
			t.Fatalf("rcode %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
		}
	}
	waitUntil(t, "the lone dead upstream asked twice more", func() bool { return asked.Load() == 3 })
}

// TestUpstreamOrder: fewest consecutive failures first, configuration order
// among equals.
func TestUpstreamOrder(t *testing.T) {
	tests := []struct {
		failures []uint32
		want     []string
	}{
		{[]uint32{0, 0, 0}, []string{"a", "b", "c"}},
		{[]uint32{1, 0, 0}, []string{"b", "c", "a"}},
		{[]uint32{2, 0, 1}, []string{"b", "c", "a"}},
		{[]uint32{1, 1, 1}, []string{"a", "b", "c"}},
	}
	for _, tc := range tests {
		s := newServer(t, Config{Upstreams: []string{"a:53", "b:53", "c:53"}})
		for i, f := range tc.failures {
			s.fw.upstreams[i].failures.Store(f)
		}
		var got []string
		for _, u := range s.fw.order() {
			got = append(got, strings.TrimSuffix(u.addr, ":53"))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("failures %v: order %v, want %v", tc.failures, got, tc.want)
		}
	}
}

// TestUpstreamSpoofIgnored: a datagram with the wrong id or question does
// not answer a forwarded query; the real answer after it does.
func TestUpstreamSpoofIgnored(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer pc.Close()
	wg.Go(func() {
		buf := make([]byte, 4096)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil {
			return
		}
		reply := func(mutate func(*dns.Msg), ip string) {
			m := new(dns.Msg)
			m.SetReply(req)
			rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A " + ip)
			m.Answer = []dns.RR{rr}
			mutate(m)
			b, _ := m.Pack()
			pc.WriteTo(b, from)
		}
		reply(func(m *dns.Msg) { m.Id++ }, "6.6.6.6")
		reply(func(m *dns.Msg) { m.Question[0].Name = "evil.example." }, "6.6.6.7")
		reply(func(*dns.Msg) {}, "8.8.4.4")
	})
	s := newServer(t, Config{Upstreams: []string{pc.LocalAddr().String()}})
	if got := records(ask(t, s, query("www.bing.com", dns.TypeA), false).Answer); !slices.Equal(got, []string{"www.bing.com. A 8.8.4.4"}) {
		t.Fatalf("answers %q", got)
	}
}

// TestIPv6Unavailable: an IPv6 address that cannot be bound is skipped
// when another address was bound; any other failure fails Start.
func TestIPv6Unavailable(t *testing.T) {
	tests := []struct {
		name  string
		addrs []string
		ok    bool
	}{
		{"IPv6 not bindable, IPv4 serves", []string{"127.0.0.1:0", "[2001:db8::1]:0"}, true},
		{"only IPv6, not bindable", []string{"[2001:db8::1]:0"}, false},
		{"an IPv4 failure is not tolerated", []string{"127.0.0.1:0", "192.0.2.1:0"}, false},
		{"bad address", []string{"localhost"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, Config{Addrs: tc.addrs})
			err := s.Start(context.Background())
			if (err == nil) != tc.ok {
				t.Fatalf("Start: %v, want ok=%v", err, tc.ok)
			}
			if tc.ok {
				if len(s.UDPAddrs()) != 1 {
					t.Fatalf("bound %v", s.UDPAddrs())
				}
				if got := exchange(t, "udp", s.UDPAddrs()[0].String(), query("productpage", dns.TypeA)); len(got.Answer) != 1 {
					t.Fatalf("answer %v", got)
				}
			}
		})
	}
}

// TestDrainAndClose: Drain stops serving and returns once in-flight work
// is done; Close ends a server blocked on an upstream. goleak checks that
// nothing is left.
func TestDrainAndClose(t *testing.T) {
	s := started(t, Config{})
	addr := s.UDPAddrs()[0].String()
	exchange(t, "tcp", addr, query("productpage", dns.TypeA))
	idle, err := net.Dial("tcp", addr) // an idle client connection
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Drain(ctx)
	if ctx.Err() != nil {
		t.Fatal("drain waited for the idle connection")
	}
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	if _, _, err := c.Exchange(query("productpage", dns.TypeA), addr); err == nil {
		t.Fatal("answered after Drain")
	}
	s.Close() // again: a no-op

	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	s2 := started(t, Config{Upstreams: []string{silent.LocalAddr().String()}, UpstreamTimeout: time.Hour})
	u, err := net.Dial("udp", s2.UDPAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.Write(pack(t, query("www.bing.com", dns.TypeA)))
	buf := make([]byte, 512)
	if _, _, err := silent.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	s2.Close() // must not wait for the hour
}

// TestMetrics: istio_dns_requests_total counts every query and the
// upstream families count forwarded ones and their failures.
func TestMetrics(t *testing.T) {
	up := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
	m := metrics.New(metrics.Config{})
	s := newServer(t, Config{Upstreams: []string{up.Addr}, Metrics: m})
	ask(t, s, query("productpage", dns.TypeA), false)
	ask(t, s, query("productpage", dns.TypeAAAA), true)
	ask(t, s, query("www.bing.com", dns.TypeA), false)
	s2 := newServer(t, Config{Metrics: m}) // no upstream: a failure
	ask(t, s2, query("www.bing.com", dns.TypeA), false)

	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := func(name string, labels map[string]string) float64 {
		var total float64
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, mt := range f.Metric {
				if !hasLabels(mt, labels) {
					continue
				}
				switch {
				case mt.Counter != nil:
					total += mt.Counter.GetValue()
				case mt.Histogram != nil:
					total += float64(mt.Histogram.GetSampleCount())
				}
			}
		}
		return total
	}
	tests := []struct {
		name   string
		family string
		labels map[string]string
		want   float64
	}{
		{"all requests", "istio_dns_requests_total", nil, 4},
		{"a over udp", "istio_dns_requests_total", map[string]string{"request_query_type": "a", "request_protocol": "udp"}, 3},
		{"aaaa over tcp", "istio_dns_requests_total", map[string]string{"request_query_type": "aaaa", "request_protocol": "tcp"}, 1},
		{"forwarded", "istio_dns_upstream_requests_total", nil, 2},
		{"failed", "istio_dns_upstream_failures_total", nil, 1},
		{"timed", "istio_dns_upstream_request_duration_seconds", nil, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sum(tc.family, tc.labels); got != tc.want {
				t.Fatalf("%s%v = %v, want %v", tc.family, tc.labels, got, tc.want)
			}
		})
	}
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.Label {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func TestReadResolvConf(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, text   string
		servers, dom []string
	}{
		{"kubernetes pod", "search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
			[]string{"10.96.0.10:53"}, []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"}},
		{"IPv6 and several servers", "nameserver 192.0.2.53\nnameserver 2001:db8::53\n", []string{"192.0.2.53:53", "[2001:db8::53]:53"}, nil},
		{"empty", "", nil, nil},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "resolv"+string(rune('0'+i)))
			if err := os.WriteFile(p, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			rc, err := ReadResolvConf(p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rc.Servers, tc.servers) || !slices.Equal(rc.Search, tc.dom) {
				t.Fatalf("got %+v", rc)
			}
		})
	}
	if _, err := ReadResolvConf(filepath.Join(dir, "missing")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	s := newServer(t, Config{})
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no state", Config{Client: s.cfg.Client}, "State"},
		{"no namespace", Config{State: s.cfg.State}, "namespace"},
		{"bad upstream", Config{State: s.cfg.State, Client: s.cfg.Client, Upstreams: []string{"10.0.0.1"}}, "upstream"},
		{"no address", Config{State: s.cfg.State, Client: s.cfg.Client, Addrs: []string{}}, "address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}
