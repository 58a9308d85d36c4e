package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestAnswerCache: an upstream answer is served again for its TTL, aged by
// the time it spent in the cache; negative answers for the SOA's negative
// TTL; a truncated reply, SERVFAIL and answers with no TTL are not kept;
// the least recently used entry goes first.
func TestAnswerCache(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newAnswerCache(2, func() time.Time { return now })
	answer := func(q *dns.Msg, rcode int, rrs ...string) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Rcode = rcode
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := rr.(*dns.SOA); ok {
				m.Ns = append(m.Ns, rr)
			} else {
				m.Answer = append(m.Answer, rr)
			}
		}
		return m
	}
	a := query("www.example.com", dns.TypeA)
	c.put(a, answer(a, dns.RcodeSuccess, "www.example.com. 60 IN A 192.0.2.1", "www.example.com. 30 IN A 192.0.2.2"))
	now = now.Add(10 * time.Second)
	// Another spelling of the name, another id.
	again := query("WWW.Example.com", dns.TypeA)
	got := c.get(again)
	if got == nil {
		t.Fatal("a fresh answer was not served from the cache")
	}
	if got.Id != again.Id || got.Question[0].Name != "WWW.Example.com." {
		t.Errorf("served with id %d question %q, want the client's %d and spelling", got.Id, got.Question[0].Name, again.Id)
	}
	if ttls := []uint32{got.Answer[0].Header().Ttl, got.Answer[1].Header().Ttl}; !slices.Equal(ttls, []uint32{50, 20}) {
		t.Errorf("TTLs %v, want aged by 10 s: [50 20]", ttls)
	}
	now = now.Add(20 * time.Second) // 30 s: the smallest TTL is up
	if c.get(a) != nil {
		t.Error("served past its smallest TTL")
	}

	nx := query("nope.example.com", dns.TypeA)
	c.put(nx, answer(nx, dns.RcodeNameError, "example.com. 3600 IN SOA ns. host. 1 2 3 4 120"))
	if got := c.get(nx); got == nil || got.Rcode != dns.RcodeNameError {
		t.Fatal("NXDOMAIN with a SOA was not cached")
	}
	now = now.Add(121 * time.Second) // the SOA's MINIMUM, 120 s
	if c.get(nx) != nil {
		t.Error("NXDOMAIN served past the SOA's negative TTL")
	}

	for _, tc := range []struct {
		name string
		resp func(q *dns.Msg) *dns.Msg
	}{
		{"truncated", func(q *dns.Msg) *dns.Msg {
			m := answer(q, dns.RcodeSuccess, "t.example.com. 60 IN A 192.0.2.3")
			m.Truncated = true
			return m
		}},
		{"SERVFAIL", func(q *dns.Msg) *dns.Msg { return answer(q, dns.RcodeServerFailure) }},
		{"NXDOMAIN without SOA", func(q *dns.Msg) *dns.Msg { return answer(q, dns.RcodeNameError) }},
		{"TTL 0", func(q *dns.Msg) *dns.Msg { return answer(q, dns.RcodeSuccess, "t.example.com. 0 IN A 192.0.2.3") }},
	} {
		q := query("t.example.com", dns.TypeA)
		c.put(q, tc.resp(q))
		if c.get(q) != nil {
			t.Errorf("%s was cached", tc.name)
		}
	}

	// Capacity 2: the least recently used goes.
	c = newAnswerCache(2, func() time.Time { return now })
	for _, n := range []string{"one", "two"} {
		q := query(n+".example.com", dns.TypeA)
		c.put(q, answer(q, dns.RcodeSuccess, n+".example.com. 60 IN A 192.0.2.1"))
	}
	c.get(query("one.example.com", dns.TypeA)) // one is now the more recent
	q3 := query("three.example.com", dns.TypeA)
	c.put(q3, answer(q3, dns.RcodeSuccess, "three.example.com. 60 IN A 192.0.2.1"))
	if c.len() != 2 || c.get(query("two.example.com", dns.TypeA)) != nil || c.get(query("one.example.com", dns.TypeA)) == nil {
		t.Error("the least recently used entry was not the one evicted")
	}
}

// TestForwardedAnswersCached: through the server, a forwarded name asked
// again within its TTL is answered without going upstream, over UDP and
// TCP alike; with the cache off every query goes upstream.
func TestForwardedAnswersCached(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cacheSize int
		upstream  int // queries upstream sees for 4 asks
	}{
		{"cache on (default)", 0, 1},
		{"cache off", -1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
			s := started(t, Config{Upstreams: []string{up.Addr}, CacheSize: tc.cacheSize})
			addr := s.UDPAddrs()[0].String()
			for _, network := range []string{"udp", "tcp", "udp", "tcp"} {
				if got := records(exchange(t, network, addr, query("www.bing.com", dns.TypeA)).Answer); !slices.Equal(got, []string{"www.bing.com. A 8.8.8.8"}) {
					t.Fatalf("%s: %q", network, got)
				}
			}
			if n := len(up.Asked()); n != tc.upstream {
				t.Fatalf("upstream asked %d times (%v), want %d", n, up.Asked(), tc.upstream)
			}
		})
	}
}

// TestResolvConfOptions: resolv.conf's timeout and attempts are read, with
// resolv.conf(5)'s defaults, and attempts rounds through a dead upstream
// are made before SERVFAIL.
func TestResolvConfOptions(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text     string
		timeout  time.Duration
		attempts int
	}{
		{"nameserver 192.0.2.53\noptions timeout:1 attempts:3 ndots:5\n", time.Second, 3},
		{"nameserver 192.0.2.53\n", 5 * time.Second, 2},
	} {
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		rc, err := ReadResolvConf(p)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Timeout != tc.timeout || rc.Attempts != tc.attempts {
			t.Errorf("%q: timeout %v attempts %d, want %v %d", tc.text, rc.Timeout, rc.Attempts, tc.timeout, tc.attempts)
		}
	}
	dead := startHangUpstream(t)
	s := started(t, Config{Upstreams: []string{dead.Addr}, UpstreamTimeout: 100 * time.Millisecond, UpstreamAttempts: 3})
	resp := exchange(t, "udp", s.UDPAddrs()[0].String(), query("x.hang.example", dns.TypeA))
	if resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
	}
	if n := dead.udp.Load(); n != 3 {
		t.Fatalf("the dead upstream was asked %d times, want 3 (attempts:3)", n)
	}
}

// TestResolverCaches: the on-demand Resolver answers from the upstream and
// keeps the answer for its TTL, as the DNS proxy's forwarder does; a name
// that does not exist is not found.
func TestResolverCaches(t *testing.T) {
	up := startUpstream(t, map[string]string{"A app.example.com.": "192.0.2.7", "AAAA app.example.com.": "2001:db8::7"})
	r, err := NewResolver(ResolverConfig{Upstreams: []string{up.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		addrs, err := r.LookupNetIP(ctx, "ip", "app.example.com")
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		if want := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}; !slices.Equal(addrs, want) {
			t.Fatalf("addresses %v, want %v", addrs, want)
		}
	}
	if addrs, err := r.LookupNetIP(ctx, "ip4", "app.example.com"); err != nil || len(addrs) != 1 {
		t.Fatalf("ip4: %v %v", addrs, err)
	}
	if n := len(up.Asked()); n != 2 {
		t.Fatalf("upstream asked %d times (%v), want once per type", n, up.Asked())
	}
	var dnsErr *net.DNSError
	if _, err := r.LookupNetIP(ctx, "ip", "nope.example.com"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Fatalf("unknown name: %v, want not found", err)
	}
}

// TestResolverIPv4Only: with IPV6_ENABLED=false the daemon's on-demand
// lookups ask A only, as ztunnel's resolver with LookupIpStrategy::Ipv4Only.
func TestResolverIPv4Only(t *testing.T) {
	up := startUpstream(t, map[string]string{"A app.example.com.": "192.0.2.7", "AAAA app.example.com.": "2001:db8::7"})
	r, err := NewResolver(ResolverConfig{Upstreams: []string{up.Addr}, IPv4Only: true})
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := r.LookupNetIP(context.Background(), "ip", "app.example.com")
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}; err != nil || !slices.Equal(addrs, want) {
		t.Fatalf("addresses %v, %v, want %v", addrs, err, want)
	}
	if asked := up.Asked(); len(asked) != 1 {
		t.Fatalf("upstream asked %v, want the A question alone", asked)
	}
}
