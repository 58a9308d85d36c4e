package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ips(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func vips(network string, s ...string) []state.NetworkAddress {
	out := make([]state.NetworkAddress, len(s))
	for i, a := range ips(s...) {
		out[i] = state.NetworkAddress{Network: network, Addr: a}
	}
	return out
}

func svc(ns, host string, v []state.NetworkAddress) *state.Service {
	return &state.Service{Name: strings.SplitN(host, ".", 2)[0], Namespace: ns, Hostname: host, VIPs: v, Ports: map[uint16]uint16{80: 8080}}
}

func pod(ns, name string, addrs []netip.Addr, services ...string) *state.Workload {
	w := &state.Workload{UID: "cluster1//v1/Pod/" + ns + "/" + name, Name: name, Addresses: addrs,
		Capacity: 1, Labels: &state.WorkloadLabels{Namespace: ns}}
	m := map[string]map[uint16]uint16{}
	for _, s := range services {
		m[s] = map[uint16]uint16{80: 8080}
	}
	w.Services = state.ServicesOf(m)
	return w
}

// testSnapshot is the mesh of the lookup tests; the client is ns1/client.
func testSnapshot(t testing.TB) *state.Snapshot {
	t.Helper()
	private := svc("ns2", "private.ns2.svc.cluster.local", vips("", "10.0.0.99"))
	private.Visibility = state.VisibilityNamespace
	v4only := svc("ns1", "headless4.ns1.svc.cluster.local", nil)
	v4only.IPFamilies = state.IPFamiliesIPv4
	canonical := svc("ns3", "canonical.io", vips("", "10.10.10.141"))
	canonical.Canonical = true
	many := svc("ns1", "many.ns1.svc.cluster.local", nil)
	services := []*state.Service{
		svc("ns1", "productpage.ns1.svc.cluster.local", vips("", "9.9.9.9")),
		svc("ns2", "example.ns2.svc.cluster.local", vips("", "10.10.10.10")),
		svc("ns1", "dual.localhost", vips("", "2.2.2.2", "2001:db8::8329")),
		svc("ns1", "ipv6.localhost", vips("", "2001:db8::2")),
		svc("ns1", "ipv4.localhost", vips("", "3.3.3.3")),
		svc("ns1", "*.wildcard", vips("", "10.10.10.10")),
		svc("ns1", "*.b.wildcard", vips("", "11.11.11.11")),
		svc("ns1", "*.svc.mesh.company.net", vips("", "10.1.2.3")),
		svc("ns1", "www.google.com", vips("", "1.1.1.1")),
		svc("ns1", "both-networks.ns1.svc.cluster.local", append(vips("", "21.21.21.21"), vips("nw2", "22.22.22.22")...)),
		svc("ns1", "nw2-only.ns1.svc.cluster.local", vips("nw2", "23.23.23.23")),
		svc("ns1", "headless.ns1.svc.cluster.local", nil),
		v4only,
		svc("ns1", "headless.example.com", nil),
		private,
		svc("ns2", "canonical.io", vips("", "10.10.10.140")),
		canonical,
		svc("ns1", "everywhere.io", vips("", "10.10.10.112")),
		svc("ns2", "everywhere.io", vips("", "10.10.10.113")),
		svc("ns1", "big.ns1.svc.cluster.local", vips("", "40.0.0.1", "40.0.0.2", "40.0.0.3", "40.0.0.4", "40.0.0.5", "40.0.0.6", "40.0.0.7", "40.0.0.8")),
		many,
	}
	workloads := []*state.Workload{
		pod("ns1", "client", ips("10.244.0.2")),
		pod("ns1", "pod0", ips("30.30.30.30", "2001:db8::30"), "ns1/headless.ns1.svc.cluster.local", "ns1/headless4.ns1.svc.cluster.local"),
		pod("ns1", "pod1", ips("31.31.31.31", "2001:db8::31"), "ns1/headless.ns1.svc.cluster.local"),
		pod("ns1", "ext0", ips("32.32.32.32"), "ns1/headless.example.com"),
	}
	for i := range 120 {
		a := netip.AddrFrom4([4]byte{50, 0, byte(i / 250), byte(i%250 + 1)})
		workloads = append(workloads, pod("ns1", "many"+string(rune('a'+i/26))+string(rune('a'+i%26)), []netip.Addr{a}, "ns1/many.ns1.svc.cluster.local"))
	}
	snap, err := state.NewSnapshot(workloads, services, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func newServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.State == nil {
		cfg.State = state.NewStore(testSnapshot(t))
	}
	if cfg.Client.Namespace == "" {
		cfg.Client = state.WorkloadInfo{Namespace: "ns1", Name: "client", ServiceAccount: "default"}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// query packs a question as a stub resolver would (RD set, random id).
func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return m
}

func pack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// handle runs one query through the whole handler, as the serve loops do
// but without their budgets: answered locally, or forwarded.
func (s *Server) handle(ctx context.Context, raw []byte, tcp bool) []byte {
	out, fwd := s.prepare(ctx, raw, tcp)
	if fwd != nil {
		return s.resolve(ctx, fwd)
	}
	return out
}

// ask runs a query through the handler and decodes the reply.
func ask(t testing.TB, s *Server, m *dns.Msg, tcp bool) *dns.Msg {
	t.Helper()
	raw := s.handle(context.Background(), pack(t, m), tcp)
	if raw == nil {
		t.Fatalf("%s: no reply", m.Question[0].String())
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(raw); err != nil {
		t.Fatalf("reply does not decode: %v", err)
	}
	if resp.Id != m.Id || !resp.Response {
		t.Fatalf("reply id %d response %v, want id %d", resp.Id, resp.Response, m.Id)
	}
	return resp
}

// records formats answers as sorted "name type value" strings.
func records(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		h := rr.Header()
		var v string
		switch r := rr.(type) {
		case *dns.A:
			v = r.A.String()
		case *dns.AAAA:
			v = r.AAAA.String()
		case *dns.CNAME:
			v = r.Target
		case *dns.TXT:
			v = strings.Join(r.Txt, " ")
		default:
			v = rr.String()
		}
		out = append(out, h.Name+" "+dns.TypeToString[h.Rrtype]+" "+v)
	}
	slices.Sort(out)
	return out
}

// upstream is a fake resolver on loopback (UDP and TCP on one port): it
// answers the names it knows and NXDOMAIN otherwise, and records what it
// was asked.
type upstream struct {
	Addr string
	srvs []*dns.Server

	mu    sync.Mutex // guards asked
	asked []string
}

func startUpstream(t testing.TB, answers map[string]string) *upstream {
	t.Helper()
	pc, ln := listenUDPAndTCP(t)
	u := &upstream{Addr: pc.LocalAddr().String()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		u.mu.Lock()
		u.asked = append(u.asked, w.RemoteAddr().Network()+" "+q.Name+" "+dns.TypeToString[q.Qtype])
		u.mu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(r)
		if rr, ok := answers[dns.TypeToString[q.Qtype]+" "+strings.ToLower(q.Name)]; ok {
			rec, err := dns.NewRR(q.Name + " 60 IN " + dns.TypeToString[q.Qtype] + " " + rr)
			if err != nil {
				panic(err)
			}
			resp.Answer = append(resp.Answer, rec)
		} else {
			resp.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(resp)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		u.srvs = append(u.srvs, srv)
	}
	t.Cleanup(func() {
		for _, srv := range u.srvs {
			srv.Shutdown()
		}
	})
	return u
}

// Asked returns the questions received, as "net name type".
func (u *upstream) Asked() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.asked)
}

// listenUDPAndTCP listens on one loopback port over UDP and TCP, as a
// resolver does.
func listenUDPAndTCP(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	for range 8 { // the UDP port may be taken for TCP
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal(err)
	return nil, nil
}
