package e2e

import (
	"context"
	"fmt"
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

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// dnsConfig: a client on node-a, a service web (VIP 10.96.0.10) backed by
// server on node-b; the lab adds a resolver pod on node-b that plays the
// cluster's DNS server.
const dnsConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  services:
    default/web.default.svc.cluster.local: {80: 8080}
services:
- name: web
  namespace: default
  hostname: web.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
`

// fakeResolver is the upstream DNS server, inside a pod: it answers the
// questions it was given records for and records who asked what.
type fakeResolver struct {
	srvs []*dns.Server
	mu   sync.Mutex // guards asked and askedTCP
	// asked holds "source-ip name" per query.
	asked []string
	// askedTCP holds "name type" per query that came over TCP.
	askedTCP []string
}

func startFakeResolver(t *testing.T, pod *netnslab.Pod) *fakeResolver {
	t.Helper()
	return startResolver(t, pod, map[string]string{"external.example.com.": "192.0.2.7"})
}

// startResolver serves answers (fully qualified name, any case -> IPv4
// address) on port 53 of pod; other names get NXDOMAIN.
func startResolver(t *testing.T, pod *netnslab.Pod, answers map[string]string) *fakeResolver {
	t.Helper()
	records := map[string][]string{}
	for name, a := range answers {
		records[name] = []string{name + " 60 IN A " + a}
	}
	return startResolverRecords(t, pod, records)
}

// startResolverRecords serves records (fully qualified name, any case ->
// its records in zone-file syntax, of any type) on port 53 of pod: a
// question gets the name's records of its type (an empty NOERROR when the
// name has none of it); other names get NXDOMAIN. Over UDP a reply that
// does not fit the client's size (512 bytes, or its EDNS size) is sent
// with TC set and no records, as authoritative servers may cut it, so that
// only a client that retries over TCP gets any.
func startResolverRecords(t *testing.T, pod *netnslab.Pod, records map[string][]string) *fakeResolver {
	t.Helper()
	pc, err := pod.ListenPacket("udp", "0.0.0.0:53")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := pod.Listen("tcp", "0.0.0.0:53")
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	r := &fakeResolver{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		host, _, _ := net.SplitHostPort(w.RemoteAddr().String())
		_, tcp := w.RemoteAddr().(*net.TCPAddr)
		r.mu.Lock()
		r.asked = append(r.asked, host+" "+q.Name)
		if tcp {
			r.askedTCP = append(r.askedTCP, q.Name+" "+dns.TypeToString[q.Qtype])
		}
		r.mu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(req)
		rrs, ok := records[strings.ToLower(q.Name)]
		if !ok {
			resp.Rcode = dns.RcodeNameError
		}
		for _, text := range rrs {
			rr, err := dns.NewRR(text)
			if err != nil {
				panic(err)
			}
			if rr.Header().Rrtype == q.Qtype {
				rr.Header().Name = q.Name
				resp.Answer = append(resp.Answer, rr)
			}
		}
		if !tcp {
			size := dns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				size = max(int(opt.UDPSize()), size)
				resp.SetEdns0(opt.UDPSize(), false)
			}
			if resp.Len() > size {
				resp.Answer, resp.Truncated = nil, true
			}
		}
		w.WriteMsg(resp)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		up := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(up) }
		go srv.ActivateAndServe()
		<-up
		r.srvs = append(r.srvs, srv)
	}
	t.Cleanup(func() {
		for _, srv := range r.srvs {
			srv.Shutdown()
		}
	})
	return r
}

// AskedTCP returns "name type" of each question asked over TCP.
func (r *fakeResolver) AskedTCP() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.askedTCP)
}

func (r *fakeResolver) Asked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.asked)
}

// TestDNSProxyShared: in shared mode with istio-cni's DNS capture rules, a
// pod's queries to its resolver reach the daemon's DNS proxy in the pod's
// namespace; a service name is answered with its VIP there, and an unknown
// name is forwarded to the resolver from the pod's own address (the socket
// was made inside the pod's namespace) and its answer returned.
func TestDNSProxyShared(t *testing.T) {
	lab := netnslab.New(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The daemons read their resolv.conf at start, before the test knows the
	// resolver pod; pods are numbered per node in order, so it is node-b's
	// second (checked below).
	c := startSharedCluster(ctx, t, lab, dnsConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: dir, ExtraPods: map[string][]string{"node-b": {"resolver"}},
		Capture:   netnslab.CaptureOptions{RedirectDNS: true},
		DaemonEnv: []string{"ISTIO_META_DNS_CAPTURE=true", "ZTUNNEL_RESOLV_CONF=" + writeResolvConf(t, dir, "10.244.1.3")},
	})
	resolverPod := c.Pods["resolver"]
	if resolverPod.IP.String() != "10.244.1.3" {
		t.Fatalf("resolver pod got %s; the resolv.conf names 10.244.1.3", resolverPod.IP)
	}
	// big.example.com's 256 A records (as ztunnel's large_response) make a
	// reply of about 4 KiB: too big for UDP.
	records := map[string][]string{
		"external.example.com.": {"external.example.com. 60 IN A 192.0.2.7"},
		"other.example.com.":    {"other.example.com. 60 IN A 192.0.2.8"},
	}
	for _, name := range []string{"big.example.com.", "big-edns.example.com."} {
		for i := range 256 {
			records[name] = append(records[name], fmt.Sprintf("%s 60 IN A 198.51.%d.%d", name, 100+i/128, i%128+1))
		}
	}
	resolver := startResolverRecords(t, resolverPod, records)
	client := c.Pods["client"]

	tests := []struct {
		name     string
		network  string
		server   string // where the client sends the query
		host     string
		want     []string
		upstream bool // the resolver must have been asked, from the client's IP
	}{
		{"service short name over UDP", "udp", "10.244.1.3:53", "web", []string{"web. A 10.96.0.10"}, false},
		{"service FQDN over TCP", "tcp", "10.244.1.3:53", "web.default.svc.cluster.local", []string{"web.default.svc.cluster.local. A 10.96.0.10"}, false},
		{"service with a search domain", "udp", "10.244.1.3:53", "web.default.svc.cluster.local.default.svc.cluster.local",
			[]string{"web.default.svc.cluster.local. A 10.96.0.10", "web.default.svc.cluster.local.default.svc.cluster.local. CNAME web.default.svc.cluster.local."}, false},
		{"unknown name forwarded over UDP", "udp", "10.244.1.3:53", "external.example.com", []string{"external.example.com. A 192.0.2.7"}, true},
		{"unknown name forwarded over TCP", "tcp", "10.244.1.3:53", "other.example.com", []string{"other.example.com. A 192.0.2.8"}, true},
		// Issue 34: a forwarded answer is kept for its TTL, as ztunnel's
		// resolver keeps it: asked again, over either transport, it is
		// answered without the resolver.
		{"forwarded answer cached (UDP)", "udp", "10.244.1.3:53", "other.example.com", []string{"other.example.com. A 192.0.2.8"}, false},
		{"forwarded answer cached (TCP)", "tcp", "10.244.1.3:53", "external.example.com", []string{"external.example.com. A 192.0.2.7"}, false},
		{"the proxy's own address", "udp", "127.0.0.1:15053", "web", []string{"web. A 10.96.0.10"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(resolver.Asked())
			resp := podQuery(ctx, t, client, tc.network, tc.server, tc.host)
			var got []string
			for _, rr := range resp.Answer {
				switch r := rr.(type) {
				case *dns.A:
					got = append(got, r.Hdr.Name+" A "+r.A.String())
				case *dns.CNAME:
					got = append(got, r.Hdr.Name+" CNAME "+r.Target)
				}
			}
			slices.Sort(got)
			if resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, tc.want) {
				t.Fatalf("%s %q, want %q", dns.RcodeToString[resp.Rcode], got, tc.want)
			}
			asked := resolver.Asked()[before:]
			if !tc.upstream {
				if len(asked) > 0 {
					t.Fatalf("answered locally or from the cache, yet the resolver was asked %q", asked)
				}
				return
			}
			want := client.IP.String() + " " + dns.Fqdn(tc.host)
			if !slices.Contains(asked, want) {
				t.Fatalf("resolver asked %q, want %q (from the client pod's address)", asked, want)
			}
		})
	}
	// ztunnel's large_response (src/dns/server.rs), on a forwarded answer:
	// over UDP the client gets as many records as fit its size with TC
	// set, over TCP all of them. The resolver cuts its own UDP reply to no
	// record at all, so the records the UDP client gets came from the
	// proxy asking again over TCP, as ztunnel's resolver does.
	for _, tc := range []struct {
		host string
		edns uint16 // the client's EDNS UDP size; 0 sends none (512 bytes)
	}{{"big.example.com", 0}, {"big-edns.example.com", 1232}} {
		t.Run("forwarded answer too big for UDP: "+tc.host, func(t *testing.T) {
			size := dns.MinMsgSize
			if tc.edns != 0 {
				size = int(tc.edns)
			}
			q := new(dns.Msg)
			q.SetQuestion(dns.Fqdn(tc.host), dns.TypeA)
			if tc.edns != 0 {
				q.SetEdns0(tc.edns, false)
			}
			resp, wire := podExchange(ctx, t, client, "udp", "10.244.1.3:53", q)
			// Each more A record takes 16 bytes (its name compressed).
			if !resp.Truncated || len(wire) > size || len(wire)+16 <= size || resp.Rcode != dns.RcodeSuccess {
				t.Errorf("over UDP: %s, TC=%v, %d records in %d bytes; want TC set and as many records as fit in %d bytes",
					dns.RcodeToString[resp.Rcode], resp.Truncated, len(resp.Answer), len(wire), size)
			}
			if got := resolver.AskedTCP(); !slices.Contains(got, dns.Fqdn(tc.host)+" A") {
				t.Errorf("the resolver's truncated UDP reply was not asked again over TCP (TCP questions: %q)", got)
			}
			resp, wire = podExchange(ctx, t, client, "tcp", "10.244.1.3:53", q)
			if resp.Truncated || len(resp.Answer) != 256 || resp.Rcode != dns.RcodeSuccess {
				t.Errorf("over TCP: %s, TC=%v, %d records in %d bytes; want all 256 untruncated",
					dns.RcodeToString[resp.Rcode], resp.Truncated, len(resp.Answer), len(wire))
			}
		})
	}
}

// writeResolvConf writes the daemons' resolv.conf naming one nameserver.
func writeResolvConf(t *testing.T, dir, nameserver string) string {
	t.Helper()
	p := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver "+nameserver+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// podQuery asks an A question from inside pod, as its stub resolver would.
func podQuery(ctx context.Context, t *testing.T, pod *netnslab.Pod, network, server, host string) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), dns.TypeA)
	resp, _ := podExchange(ctx, t, pod, network, server, q)
	return resp
}

// podExchange sends q from inside pod and returns the reply, decoded and
// as it came on the wire.
func podExchange(ctx context.Context, t *testing.T, pod *netnslab.Pod, network, server string, q *dns.Msg) (*dns.Msg, []byte) {
	t.Helper()
	nc, err := pod.Dial(ctx, network, server)
	if err != nil {
		t.Fatal(err)
	}
	conn := &dns.Conn{Conn: nc, UDPSize: dns.MaxMsgSize}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	wire, err := conn.ReadMsgHeader(nil)
	if err != nil {
		t.Fatalf("%s %s via %s: %v", network, q.Question[0].Name, server, err)
	}
	wire = slices.Clone(wire)
	resp := new(dns.Msg)
	if err := resp.Unpack(wire); err != nil {
		t.Fatalf("%s %s via %s: %v", network, q.Question[0].Name, server, err)
	}
	if resp.Id != q.Id {
		t.Fatalf("reply id %d, want %d", resp.Id, q.Id)
	}
	return resp, wire
}

// dnsIPv6Config: a client on node-a and a dual-stack service, whose VIPs
// are answered for A and AAAA; the lab adds a resolver pod on node-a.
const dnsIPv6Config = `
workloads:
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
services:
- {name: dual, namespace: default, hostname: dual.default.svc.cluster.local, vips: ["/10.96.0.20", "/fd00:10:96::20"], ports: {80: 8080}}
`

// TestDNSProxyIPv6Disabled (issue 34): with IPV6_ENABLED=false the DNS
// proxy answers an AAAA question for a mesh name as ztunnel does then
// (src/dns/server.rs service_family_allowed): an empty authoritative
// NOERROR, though the service has an IPv6 VIP, while its A question is
// answered; an AAAA question for another name is forwarded and the
// upstream's answer returned, as ztunnel's forwarder asks whatever type it
// is given. With IPv6 enabled (the control) the same AAAA question gets the
// IPv6 VIP.
func TestDNSProxyIPv6Disabled(t *testing.T) {
	for _, ipv6 := range []bool{true, false} {
		t.Run(fmt.Sprintf("IPV6_ENABLED=%v", ipv6), func(t *testing.T) {
			lab := netnslab.New(t)
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := startSharedCluster(ctx, t, lab, dnsIPv6Config, labrun.SharedOptions{
				Binary: ztunnelBin, Dir: dir, ExtraPods: map[string][]string{"node-a": {"resolver"}},
				Capture: netnslab.CaptureOptions{RedirectDNS: true},
				DaemonEnv: []string{"ISTIO_META_DNS_CAPTURE=true", fmt.Sprintf("IPV6_ENABLED=%v", ipv6),
					"ZTUNNEL_RESOLV_CONF=" + writeResolvConf(t, dir, "10.244.0.3")},
			})
			if ip := c.Pods["resolver"].IP.String(); ip != "10.244.0.3" {
				t.Fatalf("resolver pod got %s; the resolv.conf names 10.244.0.3", ip)
			}
			resolver := startResolverRecords(t, c.Pods["resolver"], map[string][]string{
				"external.example.com.": {"external.example.com. 60 IN A 192.0.2.7", "external.example.com. 60 IN AAAA 2001:db8::7"},
			})
			meshAAAA := []string{"AAAA fd00:10:96::20"}
			if !ipv6 {
				meshAAAA = nil
			}
			tests := []struct {
				name     string
				host     string
				qtype    uint16
				want     []string
				upstream bool // forwarded to the resolver
			}{
				{"mesh name AAAA", "dual.default.svc.cluster.local", dns.TypeAAAA, meshAAAA, false},
				{"mesh name A", "dual.default.svc.cluster.local", dns.TypeA, []string{"A 10.96.0.20"}, false},
				{"forwarded name AAAA", "external.example.com", dns.TypeAAAA, []string{"AAAA 2001:db8::7"}, true},
				{"forwarded name A", "external.example.com", dns.TypeA, []string{"A 192.0.2.7"}, true},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					before := len(resolver.Asked())
					q := new(dns.Msg)
					q.SetQuestion(dns.Fqdn(tc.host), tc.qtype)
					resp, _ := podExchange(ctx, t, c.Pods["client"], "udp", "10.244.0.3:53", q)
					var got []string
					for _, rr := range resp.Answer {
						switch r := rr.(type) {
						case *dns.A:
							got = append(got, "A "+r.A.String())
						case *dns.AAAA:
							got = append(got, "AAAA "+r.AAAA.String())
						default:
							got = append(got, rr.String())
						}
					}
					if resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, tc.want) {
						t.Fatalf("%s %q, want NOERROR %q", dns.RcodeToString[resp.Rcode], got, tc.want)
					}
					if asked := len(resolver.Asked()) - before; (asked > 0) != tc.upstream {
						t.Fatalf("the resolver was asked %d times, want it asked: %v", asked, tc.upstream)
					}
					if !tc.upstream && !resp.Authoritative {
						t.Fatalf("a mesh name's answer without AA")
					}
				})
			}
		})
	}
}

// TestDNSResolvConfOptions (issue 34): the daemon honours its resolv.conf's
// "options timeout:n attempts:n", as ztunnel's resolver reads them: a
// forwarded query to a nameserver that never answers is sent attempts
// times, timeout apart, before the client gets SERVFAIL.
func TestDNSResolvConfOptions(t *testing.T) {
	lab := netnslab.New(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resolvConf := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver 10.244.1.3\noptions timeout:1 attempts:3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startSharedCluster(ctx, t, lab, dnsConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: dir, ExtraPods: map[string][]string{"node-b": {"resolver"}},
		Capture:   netnslab.CaptureOptions{RedirectDNS: true},
		DaemonEnv: []string{"ISTIO_META_DNS_CAPTURE=true", "ZTUNNEL_RESOLV_CONF=" + resolvConf},
	})
	if ip := c.Pods["resolver"].IP.String(); ip != "10.244.1.3" {
		t.Fatalf("resolver pod got %s; the resolv.conf names 10.244.1.3", ip)
	}
	// A black hole: it reads every query and answers none.
	pc, err := c.Pods["resolver"].ListenPacket("udp", "0.0.0.0:53")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var got atomic.Int32
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dns.Msg
			if m.Unpack(buf[:n]) == nil && len(m.Question) == 1 && m.Question[0].Name == "hang.example.com." {
				got.Add(1)
			}
		}
	}()
	resp := podQuery(ctx, t, c.Pods["client"], "udp", "10.244.1.3:53", "hang.example.com")
	if resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s, want SERVFAIL once the attempts are spent", dns.RcodeToString[resp.Rcode])
	}
	if n := got.Load(); n != 3 {
		t.Fatalf("the nameserver saw the query %d times, want 3 (attempts:3)", n)
	}
}
