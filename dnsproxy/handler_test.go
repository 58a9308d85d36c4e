package dnsproxy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/state"
)

// TestLookup covers every local decision, and what goes upstream instead,
// from the client ns1/client with the default search domains.
func TestLookup(t *testing.T) {
	up := startUpstream(t, map[string]string{
		"A www.bing.com.":                        "8.8.8.8",
		"TXT productpage.ns1.svc.cluster.local.": `"from-upstream"`,
	})
	// No cache: each case shows whether it went upstream (TestAnswerCache).
	s := newServer(t, Config{Upstreams: []string{up.Addr}, CacheSize: -1})
	const fwd = "forwarded"
	tests := []struct {
		name    string
		host    string
		qtype   uint16
		rcode   int
		answers []string // sorted; fwd marks "answered upstream"
	}{
		{"fqdn", "productpage.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"productpage.ns1.svc.cluster.local. A 9.9.9.9"}},
		{"short name in the client's namespace", "productpage", dns.TypeA, dns.RcodeSuccess,
			[]string{"productpage. A 9.9.9.9"}},
		{"name.namespace", "productpage.ns1", dns.TypeA, dns.RcodeSuccess,
			[]string{"productpage.ns1. A 9.9.9.9"}},
		{"name.namespace.svc", "example.ns2.svc", dns.TypeA, dns.RcodeSuccess,
			[]string{"example.ns2.svc. A 10.10.10.10"}},
		{"other namespace by name.namespace", "example.ns2", dns.TypeA, dns.RcodeSuccess,
			[]string{"example.ns2. A 10.10.10.10"}},
		{"short name of another namespace is not ours", "example", dns.TypeA, dns.RcodeNameError, []string{fwd}},
		{"case does not matter, the asked spelling is kept", "ProductPage.NS1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"ProductPage.NS1.svc.cluster.local. A 9.9.9.9"}},
		{"search domain stripped gives a CNAME", "productpage.ns1.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"productpage.ns1. A 9.9.9.9", "productpage.ns1.ns1.svc.cluster.local. CNAME productpage.ns1."}},
		{"external host with search domain gives a CNAME", "www.google.com.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"www.google.com. A 1.1.1.1", "www.google.com.ns1.svc.cluster.local. CNAME www.google.com."}},
		{"external host", "www.google.com", dns.TypeA, dns.RcodeSuccess, []string{"www.google.com. A 1.1.1.1"}},
		{"known host without the asked family is empty NOERROR", "productpage.ns1.ns1.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"A of a dual-stack service", "dual.localhost", dns.TypeA, dns.RcodeSuccess, []string{"dual.localhost. A 2.2.2.2"}},
		{"AAAA of a dual-stack service", "dual.localhost", dns.TypeAAAA, dns.RcodeSuccess, []string{"dual.localhost. AAAA 2001:db8::8329"}},
		{"A of an IPv6-only service is empty", "ipv6.localhost", dns.TypeA, dns.RcodeSuccess, nil},
		{"AAAA of an IPv4-only service is empty", "ipv4.localhost", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"wildcard", "foo.wildcard", dns.TypeA, dns.RcodeSuccess, []string{"foo.wildcard. A 10.10.10.10"}},
		{"most specific wildcard wins", "a.b.wildcard", dns.TypeA, dns.RcodeSuccess, []string{"a.b.wildcard. A 11.11.11.11"}},
		{"wildcard under a deeper name", "foo.foons.svc.mesh.company.net", dns.TypeA, dns.RcodeSuccess,
			[]string{"foo.foons.svc.mesh.company.net. A 10.1.2.3"}},
		{"wildcard found after a search domain has no CNAME", "foo.svc.mesh.company.net.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"foo.svc.mesh.company.net.ns1.svc.cluster.local. A 10.1.2.3"}},
		{"only VIPs of the client's network", "both-networks.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"both-networks.ns1.svc.cluster.local. A 21.21.21.21"}},
		{"no VIP on the client's network is empty", "nw2-only.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, nil},
		{"headless service answers its endpoints", "headless.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"headless.ns1.svc.cluster.local. A 30.30.30.30", "headless.ns1.svc.cluster.local. A 31.31.31.31"}},
		{"headless service AAAA", "headless", dns.TypeAAAA, dns.RcodeSuccess,
			[]string{"headless. AAAA 2001:db8::30", "headless. AAAA 2001:db8::31"}},
		{"IPv4 headless service has no AAAA from dual-stack pods", "headless4.ns1.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"pod of a headless service", "pod1.headless.ns1.svc.cluster.local", dns.TypeA, dns.RcodeSuccess,
			[]string{"pod1.headless.ns1.svc.cluster.local. A 31.31.31.31"}},
		{"pod.subdomain short form", "pod0.headless", dns.TypeAAAA, dns.RcodeSuccess,
			[]string{"pod0.headless. AAAA 2001:db8::30"}},
		{"unknown pod of a headless service", "pod9.headless.ns1.svc.cluster.local", dns.TypeA, dns.RcodeNameError, []string{fwd}},
		{"non-Kubernetes service without VIP is forwarded", "headless.example.com", dns.TypeA, dns.RcodeNameError, []string{fwd}},
		{"namespace-private service of another namespace is forwarded", "private.ns2.svc.cluster.local", dns.TypeA, dns.RcodeNameError, []string{fwd}},
		{"the client's namespace wins", "everywhere.io", dns.TypeA, dns.RcodeSuccess, []string{"everywhere.io. A 10.10.10.112"}},
		{"a canonical service wins over another namespace", "canonical.io", dns.TypeA, dns.RcodeSuccess, []string{"canonical.io. A 10.10.10.141"}},
		{"unknown name is forwarded", "www.bing.com", dns.TypeA, dns.RcodeSuccess, []string{fwd, "www.bing.com. A 8.8.8.8"}},
		{"other types are forwarded, even for known hosts", "productpage.ns1.svc.cluster.local", dns.TypeTXT, dns.RcodeSuccess,
			[]string{fwd, "productpage.ns1.svc.cluster.local. TXT from-upstream"}},
		{"root is forwarded", ".", dns.TypeA, dns.RcodeNameError, []string{fwd}},
	}
	for _, tc := range tests {
		for _, tcp := range []bool{false, true} {
			name := tc.name + map[bool]string{false: " (udp)", true: " (tcp)"}[tcp]
			t.Run(name, func(t *testing.T) {
				before := len(up.Asked())
				resp := ask(t, s, query(tc.host, tc.qtype), tcp)
				got := records(resp.Answer)
				forwarded := len(up.Asked()) > before
				if forwarded {
					got = append([]string{fwd}, got...)
				}
				if resp.Rcode != tc.rcode || !slices.Equal(got, tc.answers) {
					t.Fatalf("rcode %s answers %q, want %s %q", dns.RcodeToString[resp.Rcode], got, dns.RcodeToString[tc.rcode], tc.answers)
				}
				if resp.Authoritative == forwarded {
					t.Errorf("authoritative %v for a forwarded=%v answer", resp.Authoritative, forwarded)
				}
				for _, rr := range resp.Answer {
					if !forwarded && rr.Header().Ttl != TTL {
						t.Errorf("TTL %d, want %d", rr.Header().Ttl, TTL)
					}
				}
				if forwarded {
					last := up.Asked()[len(up.Asked())-1]
					if wantNet := map[bool]string{false: "udp", true: "tcp"}[tcp]; !strings.HasPrefix(last, wantNet+" ") {
						t.Errorf("upstream asked %q, want over %s", last, wantNet)
					}
				}
			})
		}
	}
}

func TestKubeNames(t *testing.T) {
	v := &view{ns: "ns1", domain: "cluster.local", svcDomain: "svc.cluster.local"}
	tests := []struct {
		name, host string
		want       []string
	}{
		{"service in own namespace", "name", []string{"name.ns1.svc.cluster.local"}},
		{"service.namespace or pod.subdomain", "name.ns2", []string{"name.ns2.svc.cluster.local", "name.ns2.ns1.svc.cluster.local"}},
		{"service.namespace.svc", "name.ns2.svc", []string{"name.ns2.svc.cluster.local", "name.ns2.svc.svc.cluster.local"}},
		{"pod.subdomain.namespace", "name.ns2.other", []string{"name.ns2.other.svc.cluster.local"}},
		{"pod.subdomain.namespace.svc", "pod.sub.ns.svc", []string{"pod.sub.ns.svc.cluster.local"}},
		{"four labels not ending in svc", "pod.sub.ns.other", nil},
		{"already qualified", "name.ns2.svc.cluster.local", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := v.kubeNames(tc.host); !slices.Equal(got, tc.want) {
				t.Fatalf("kubeNames(%q) = %q, want %q", tc.host, got, tc.want)
			}
		})
	}
}

func TestWildcardsAndTrim(t *testing.T) {
	if got, want := wildcards("svc1.ns1.svc.cluster.local"), []string{
		"svc1.ns1.svc.cluster.local", "*.ns1.svc.cluster.local", "*.svc.cluster.local", "*.cluster.local", "*.local",
	}; !slices.Equal(got, want) {
		t.Errorf("wildcards = %q, want %q", got, want)
	}
	if got := wildcards("svc1"); !slices.Equal(got, []string{"svc1"}) {
		t.Errorf("wildcards(svc1) = %q", got)
	}
	tests := []struct {
		name, host, domain, want string
		ok                       bool
	}{
		{"suffix on a label boundary", "a.b.cluster.local", "cluster.local", "a.b", true},
		{"not on a label boundary", "a.bcluster.local", "cluster.local", "", false},
		{"the domain itself", "cluster.local", "cluster.local", "", false},
		{"empty domain", "a.b", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := trimDomain(tc.host, tc.domain); got != tc.want || ok != tc.ok {
				t.Fatalf("trimDomain = %q %v, want %q %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestSearchDomainsAndDomain: a configured search list (dedicated mode's
// resolv.conf) and a cluster domain other than cluster.local.
func TestSearchDomainsAndDomain(t *testing.T) {
	snap, err := state.NewSnapshot([]*state.Workload{pod("prod", "client", ips("10.244.0.2"))},
		[]*state.Service{svc("prod", "api.prod.svc.corp.example", vips("", "10.96.0.5"))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, Config{
		State: state.NewStore(snap), Client: state.WorkloadInfo{Namespace: "prod", Name: "client"},
		Domain: "corp.example.", SearchDomains: []string{"prod.svc.corp.example.", "office.example"},
	})
	tests := []struct {
		name, host string
		want       []string
	}{
		{"short name", "api", []string{"api. A 10.96.0.5"}},
		{"configured search domain stripped", "api.office.example", []string{"api. A 10.96.0.5", "api.office.example. CNAME api."}},
		{"fqdn under the cluster domain", "api.prod.svc.corp.example", []string{"api.prod.svc.corp.example. A 10.96.0.5"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := ask(t, s, query(tc.host, dns.TypeA), false)
			if got := records(resp.Answer); resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, tc.want) {
				t.Fatalf("%s %q, want %q", dns.RcodeToString[resp.Rcode], got, tc.want)
			}
		})
	}
}

// TestClientBeforeItsWorkload: before the client's workload is in the
// snapshot the proxy answers with the namespace it was started for; once it
// is, its network decides which VIPs are returned.
func TestClientBeforeItsWorkload(t *testing.T) {
	services := []*state.Service{svc("ns1", "web.ns1.svc.cluster.local", append(vips("", "10.0.0.1"), vips("west", "10.1.0.1")...))}
	empty, _ := state.NewSnapshot(nil, services, nil)
	st := state.NewStore(empty)
	s := newServer(t, Config{State: st})
	if got := records(ask(t, s, query("web", dns.TypeA), false).Answer); !slices.Equal(got, []string{"web. A 10.0.0.1"}) {
		t.Fatalf("before the workload: %q", got)
	}
	w := pod("ns1", "client", ips("10.244.0.2"))
	w.EditLabels().Network = "west"
	snap, err := state.NewSnapshot([]*state.Workload{w}, services, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Publish(snap)
	if got := records(ask(t, s, query("web", dns.TypeA), false).Answer); !slices.Equal(got, []string{"web. A 10.1.0.1"}) {
		t.Fatalf("with the workload on network west: %q", got)
	}
}

// TestRandomOrder: the VIPs come in more than one order over a bounded
// number of queries (the chance of 200 identical shuffles of 8 is nil).
func TestRandomOrder(t *testing.T) {
	s := newServer(t, Config{})
	orders := map[string]bool{}
	for range 200 {
		resp := ask(t, s, query("big.ns1.svc.cluster.local", dns.TypeA), false)
		if len(resp.Answer) != 8 {
			t.Fatalf("%d answers, want 8", len(resp.Answer))
		}
		var order []string
		for _, rr := range resp.Answer {
			order = append(order, rr.(*dns.A).A.String())
		}
		orders[strings.Join(order, ",")] = true
		if len(orders) > 1 {
			return
		}
	}
	t.Fatal("always the same order")
}

// TestSizeLimits: a large answer is truncated (TC) to 512 bytes over UDP
// without EDNS, to the client's EDNS size with it, and whole over TCP.
func TestSizeLimits(t *testing.T) {
	s := newServer(t, Config{})
	tests := []struct {
		name    string
		edns    uint16
		tcp     bool
		maxLen  int
		wantTC  bool
		wantAll bool
	}{
		{"udp without EDNS", 0, false, 512, true, false},
		{"udp with EDNS 1232", 1232, false, 1232, true, false},
		{"udp with EDNS 4096", 4096, false, 4096, false, true},
		{"tcp", 0, true, 65535, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := query("many.ns1.svc.cluster.local", dns.TypeA)
			if tc.edns != 0 {
				m.SetEdns0(tc.edns, false)
			}
			raw := s.handle(context.Background(), pack(t, m), tc.tcp)
			if len(raw) > tc.maxLen {
				t.Fatalf("%d bytes, limit %d", len(raw), tc.maxLen)
			}
			resp := new(dns.Msg)
			if err := resp.Unpack(raw); err != nil {
				t.Fatal(err)
			}
			if resp.Truncated != tc.wantTC || (len(resp.Answer) == 120) != tc.wantAll {
				t.Fatalf("TC %v with %d answers; want TC %v, all %v", resp.Truncated, len(resp.Answer), tc.wantTC, tc.wantAll)
			}
			if tc.edns != 0 && resp.IsEdns0() == nil {
				t.Error("EDNS query answered without OPT")
			}
		})
	}
}

// TestMalformed: bytes that are no query get FORMERR, NOTIMP or nothing,
// and the server goes on answering.
func TestMalformed(t *testing.T) {
	s := newServer(t, Config{})
	good := pack(t, query("productpage", dns.TypeA))
	two := query("productpage", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	notify := query("productpage", dns.TypeSOA)
	notify.Opcode = dns.OpcodeNotify
	resp := query("productpage", dns.TypeA)
	resp.Response = true
	tests := []struct {
		name  string
		raw   []byte
		rcode int // -1: no reply
	}{
		{"empty", nil, -1},
		{"short header", good[:5], -1},
		{"a response is never answered", pack(t, resp), -1},
		{"truncated question", good[:len(good)-3], dns.RcodeFormatError},
		{"header only with a question count", good[:12:12], dns.RcodeFormatError},
		{"label pointing past the end", append(append([]byte{}, good[:12]...), 0xc0, 0xff, 0, 1, 0, 1), dns.RcodeFormatError},
		{"two questions", pack(t, two), dns.RcodeFormatError},
		{"no question", pack(t, &dns.Msg{MsgHdr: dns.MsgHdr{Id: 7}}), dns.RcodeFormatError},
		{"not a query", pack(t, notify), dns.RcodeNotImplemented},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := s.handle(context.Background(), tc.raw, false)
			if tc.rcode < 0 {
				if raw != nil {
					t.Fatalf("replied %x", raw)
				}
				return
			}
			m := new(dns.Msg)
			if err := m.Unpack(raw); err != nil {
				t.Fatalf("reply does not decode: %v", err)
			}
			if m.Rcode != tc.rcode || !m.Response || m.Id != uint16(tc.raw[0])<<8|uint16(tc.raw[1]) {
				t.Fatalf("rcode %s response %v id %d", dns.RcodeToString[m.Rcode], m.Response, m.Id)
			}
		})
	}
	if got := ask(t, s, query("productpage", dns.TypeA), false); len(got.Answer) != 1 {
		t.Fatalf("after the bad input: %v", got)
	}
}

// FuzzHandle feeds arbitrary bytes to the request handler as a UDP or TCP
// query: it must not panic, and whatever it replies must be a decodable
// response to the same id that fits the client's UDP size.
func FuzzHandle(f *testing.F) {
	s := newServer(f, Config{}) // no upstream: forwarded questions fail fast
	for _, q := range []*dns.Msg{
		query("productpage", dns.TypeA), query("headless.ns1.svc.cluster.local", dns.TypeAAAA),
		query("productpage.ns1.ns1.svc.cluster.local", dns.TypeA), query("foo.wildcard", dns.TypeA),
		query("www.bing.com", dns.TypeMX),
	} {
		b, _ := q.Pack()
		f.Add(b, false)
		q.SetEdns0(4096, true)
		b, _ = q.Pack()
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		out := s.handle(context.Background(), raw, tcp)
		if out == nil {
			return
		}
		m := new(dns.Msg)
		if err := m.Unpack(out); err != nil {
			t.Fatalf("reply does not decode: %v", err)
		}
		if !m.Response || len(raw) < 2 || m.Id != uint16(raw[0])<<8|uint16(raw[1]) {
			t.Fatalf("reply id %d response %v", m.Id, m.Response)
		}
		if !tcp && len(out) > 65535 {
			t.Fatalf("UDP reply of %d bytes", len(out))
		}
	})
}
