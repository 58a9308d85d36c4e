package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// fakeResolver is the upstream DNS server, inside a pod: it answers A
// questions for the names it was given (external.example.com by default)
// and records who asked what.
type fakeResolver struct {
	srvs []*dns.Server
	mu   sync.Mutex // guards asked
	// asked holds "source-ip name" per query.
	asked []string
}

func startFakeResolver(t *testing.T, pod *netnslab.Pod) *fakeResolver {
	t.Helper()
	return startResolver(t, pod, map[string]string{"external.example.com.": "192.0.2.7"})
}

// startResolver serves answers (fully qualified name, any case -> IPv4
// address) on port 53 of pod; other names get NXDOMAIN.
func startResolver(t *testing.T, pod *netnslab.Pod, answers map[string]string) *fakeResolver {
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
		host, _, _ := net.SplitHostPort(w.RemoteAddr().String())
		r.mu.Lock()
		r.asked = append(r.asked, host+" "+req.Question[0].Name)
		r.mu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(req)
		if a, ok := answers[strings.ToLower(req.Question[0].Name)]; ok && req.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A " + a)
			resp.Answer = append(resp.Answer, rr)
		} else if !ok {
			resp.Rcode = dns.RcodeNameError
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
	resolver := startResolver(t, resolverPod, map[string]string{"external.example.com.": "192.0.2.7", "other.example.com.": "192.0.2.8"})
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
	nc, err := pod.Dial(ctx, network, server)
	if err != nil {
		t.Fatal(err)
	}
	conn := &dns.Conn{Conn: nc}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), dns.TypeA)
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	resp, err := conn.ReadMsg()
	if err != nil {
		t.Fatalf("%s %s via %s: %v", network, host, server, err)
	}
	if resp.Id != q.Id {
		t.Fatalf("reply id %d, want %d", resp.Id, q.Id)
	}
	return resp
}
