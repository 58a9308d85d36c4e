package dnsproxy

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/fdbudget"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/metrics"
)

// hangUpstream is a resolver on loopback (UDP and TCP on one port) that
// is a black hole for names under hang.example: it reads those queries and
// never answers. Over TCP it answers names under hold.example once release
// is closed. Every other A question gets 192.0.2.1. It counts the queries
// it reads.
type hangUpstream struct {
	Addr    string
	udp     atomic.Int64 // queries read over UDP
	tcp     atomic.Int64 // queries read over TCP
	release chan struct{}
	once    sync.Once // closes release

	pc net.PacketConn
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex // guards conns
	conns []net.Conn
}

func startHangUpstream(t *testing.T) *hangUpstream {
	t.Helper()
	pc, ln := listenUDPAndTCP(t)
	u := &hangUpstream{Addr: pc.LocalAddr().String(), release: make(chan struct{}), pc: pc, ln: ln}
	u.wg.Go(u.serveUDP)
	u.wg.Go(u.serveTCP)
	t.Cleanup(func() {
		u.Release()
		pc.Close()
		ln.Close()
		u.mu.Lock()
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

// Release lets the held queries (hold.example) be answered.
func (u *hangUpstream) Release() { u.once.Do(func() { close(u.release) }) }

// reply is the answer to raw, or nil for a name that is not answered.
func (u *hangUpstream) reply(raw []byte, tcp bool) []byte {
	req := new(dns.Msg)
	if req.Unpack(raw) != nil || len(req.Question) != 1 {
		return nil
	}
	name := strings.ToLower(req.Question[0].Name)
	switch {
	case strings.HasSuffix(name, ".hang.example."):
		return nil
	case strings.HasSuffix(name, ".hold.example.") && tcp:
		<-u.release
	}
	resp := new(dns.Msg)
	resp.SetReply(req)
	rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
	resp.Answer = []dns.RR{rr}
	out, _ := resp.Pack()
	return out
}

func (u *hangUpstream) serveUDP() {
	buf := make([]byte, 65535)
	for {
		n, from, err := u.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		u.udp.Add(1)
		if out := u.reply(buf[:n], false); out != nil {
			u.pc.WriteTo(out, from)
		}
	}
}

func (u *hangUpstream) serveTCP() {
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns = append(u.conns, c)
		u.mu.Unlock()
		u.wg.Go(func() {
			for {
				msg, err := readTCPMsg(c)
				if err != nil {
					return
				}
				u.tcp.Add(1)
				if out := u.reply(msg, true); out != nil {
					writeTCPMsg(c, out)
				}
			}
		})
	}
}

func readTCPMsg(c net.Conn) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(hdr[:]))
	_, err := io.ReadFull(c, msg)
	return msg, err
}

func writeTCPMsg(c net.Conn, msg []byte) error {
	out := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	_, err := c.Write(append(out, msg...))
	return err
}

// waitUntil polls cond until it holds; the bound only turns a hang into a
// failure.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !nettest.Until(30*time.Second, cond) {
		t.Fatalf("still waiting for %s", what)
	}
}

// udpFrom is a UDP socket on the loopback address ip, to act as a client
// of its own address.
func udpFrom(t *testing.T, ip string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// flood sends n queries for distinct names under hang.example from
// client's address, then waits until the server has either forwarded or
// dropped each one (each upstream read or Dropped step accounts for one).
func flood(t *testing.T, s *Server, u *hangUpstream, client *net.UDPConn, n int) {
	t.Helper()
	to := s.UDPAddrs()[0]
	before := u.udp.Load() + int64(s.Dropped())
	for i := range n {
		name := client.LocalAddr().(*net.UDPAddr).IP.String() + "-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + ".hang.example"
		if _, err := client.WriteTo(pack(t, query(name, dns.TypeA)), to); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the flood to be forwarded or dropped", func() bool {
		return u.udp.Load()+int64(s.Dropped())-before == int64(n)
	})
}

// exchangeFrom asks one question from the loopback address ip.
func exchangeFrom(t *testing.T, network, ip, addr, name string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 20 * time.Second, Dialer: &net.Dialer{Timeout: 20 * time.Second}}
	if network == "udp" {
		c.Dialer.LocalAddr = &net.UDPAddr{IP: net.ParseIP(ip)}
	} else {
		c.Dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip)}
	}
	resp, _, err := c.Exchange(query(name, dns.TypeA), addr)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", network, name, ip, err)
	}
	return resp
}

// TestMeshNamesWhileUpstreamHangs: with every forwarding slot held by
// queries to an upstream that never answers (440 sent from four clients,
// 256 in flight), mesh names are still answered over UDP and TCP; another
// forwarded query is refused at once, SERVFAIL over TCP.
func TestMeshNamesWhileUpstreamHangs(t *testing.T) {
	u := startHangUpstream(t)
	m := metrics.New(metrics.Config{})
	s := started(t, Config{Upstreams: []string{u.Addr}, UpstreamTimeout: time.Hour, Metrics: m})
	addr := s.UDPAddrs()[0].String()
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		flood(t, s, u, udpFrom(t, ip), 110)
	}
	if got := u.udp.Load(); got != DefaultMaxInFlight {
		t.Fatalf("%d queries reached upstream, want %d (MaxInFlight)", got, DefaultMaxInFlight)
	}
	for _, network := range []string{"udp", "tcp"} {
		if got := records(exchangeFrom(t, network, "127.0.0.2", addr, "productpage").Answer); !slices.Equal(got, []string{"productpage. A 9.9.9.9"}) {
			t.Fatalf("%s: mesh name answered %q", network, got)
		}
	}
	dropped := s.Dropped()
	if resp := exchangeFrom(t, "tcp", "127.0.0.1", addr, "www.ok.example"); resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("forwarded query with no slot free: %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
	}
	if s.Dropped() != dropped+1 {
		t.Fatalf("Dropped %d, want %d", s.Dropped(), dropped+1)
	}
	// Counted where an operator sees it (issue 34), not silently.
	if udp, tcp := refusedCount(t, m, "udp"), refusedCount(t, m, "tcp"); udp != float64(dropped) || tcp != 1 {
		t.Fatalf("ztunnel_go_dns_requests_refused_total udp %v tcp %v, want %d and 1", udp, tcp, dropped)
	}
}

// refusedCount is ztunnel_go_dns_requests_refused_total{transport}.
func refusedCount(t *testing.T, m *metrics.Metrics, transport string) float64 {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "ztunnel_go_dns_requests_refused_total" {
			for _, mt := range f.GetMetric() {
				if hasLabels(mt, map[string]string{"transport": transport}) {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestForwardingFairness: one client cannot take every forwarding slot:
// while its flood hangs upstream, another client's forwarded names are
// answered, over UDP and TCP, and so is a second connection's while one
// TCP connection pipelines a flood.
func TestForwardingFairness(t *testing.T) {
	u := startHangUpstream(t)
	s := started(t, Config{Upstreams: []string{u.Addr}, UpstreamTimeout: time.Hour})
	addr := s.UDPAddrs()[0].String()
	flood(t, s, u, udpFrom(t, "127.0.0.2"), 150)
	flood(t, s, u, udpFrom(t, "127.0.0.2"), 150)
	if got := u.udp.Load(); got != DefaultMaxInFlight/2 {
		t.Fatalf("the flood has %d queries upstream, want %d (MaxInFlightPerClient)", got, DefaultMaxInFlight/2)
	}

	// One connection pipelines 40 queries that hang: MaxTCPPipeline of
	// them are forwarded, the rest wait unread.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 40 {
		if err := writeTCPMsg(c, pack(t, query("p"+string(rune('a'+i%26))+string(rune('a'+i/26))+".hang.example", dns.TypeA))); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the pipelined queries upstream", func() bool { return u.tcp.Load() == DefaultMaxTCPPipeline })

	tests := []struct{ network, ip string }{
		{"udp", "127.0.0.3"},
		{"tcp", "127.0.0.3"},
		{"tcp", "127.0.0.1"}, // the pipelining connection's address
	}
	for _, tc := range tests {
		t.Run(tc.network+" from "+tc.ip, func(t *testing.T) {
			if got := records(exchangeFrom(t, tc.network, tc.ip, addr, "www.ok.example").Answer); !slices.Equal(got, []string{"www.ok.example. A 192.0.2.1"}) {
				t.Fatalf("forwarded name answered %q", got)
			}
		})
	}
}

// TestStalledTCPConnections: 120 connections that send nothing or part of
// a query, with an idle timeout far away, do not keep a new client waiting:
// it is accepted and answered, evicting the connection idle the longest;
// a connection with a forwarded query still pending is not the one evicted.
func TestStalledTCPConnections(t *testing.T) {
	u := startHangUpstream(t)
	s := started(t, Config{Upstreams: []string{u.Addr}, UpstreamTimeout: time.Hour, TCPIdleTimeout: time.Hour})
	addr := s.UDPAddrs()[0].String()

	// An honest client whose forwarded query waits on upstream meanwhile.
	pending, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pending.Close()
	if err := writeTCPMsg(pending, pack(t, query("www.hold.example", dns.TypeA))); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the pending query upstream", func() bool { return u.tcp.Load() == 1 })

	q := pack(t, query("productpage", dns.TypeA))
	partial := [][]byte{nil, {0}, binary.BigEndian.AppendUint16(nil, uint16(len(q))), append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q[:5]...)}
	var stalled []net.Conn
	defer func() {
		for _, c := range stalled {
			c.Close()
		}
	}()
	for i := range 120 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
		if _, err := c.Write(partial[i%len(partial)]); err != nil {
			t.Fatal(err)
		}
	}

	for _, name := range []string{"productpage", "www.ok.example"} {
		if resp := exchange(t, "tcp", addr, query(name, dns.TypeA)); len(resp.Answer) != 1 {
			t.Fatalf("%s: %v", name, resp)
		}
	}
	// The first stalled connection was idle the longest: it was closed.
	stalled[0].SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := stalled[0].Read(make([]byte, 1)); err == nil || errors.Is(err, net.ErrClosed) || isTimeout(err) {
		t.Fatalf("oldest stalled connection: read %v, want it closed by the server", err)
	}
	// The busy one was not: its answer arrives once upstream gives it.
	u.Release()
	pending.SetReadDeadline(time.Now().Add(20 * time.Second))
	msg, err := readTCPMsg(pending)
	if err != nil {
		t.Fatalf("pending query: %v", err)
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(msg); err != nil || len(resp.Answer) != 1 {
		t.Fatalf("pending query answered %v %v", resp, err)
	}
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	if open > DefaultMaxTCPConns {
		t.Fatalf("%d connections open, cap %d", open, DefaultMaxTCPConns)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestTCPPipelining: on one connection, a mesh name sent after a forwarded
// query that hangs is answered first (RFC 7766: replies in any order).
func TestTCPPipelining(t *testing.T) {
	u := startHangUpstream(t)
	s := started(t, Config{Upstreams: []string{u.Addr}, UpstreamTimeout: time.Hour})
	c, err := dns.Dial("tcp", s.UDPAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	hung, mesh := query("www.hang.example", dns.TypeA), query("productpage", dns.TypeA)
	for _, m := range []*dns.Msg{hung, mesh} {
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := c.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Id != mesh.Id || len(resp.Answer) != 1 {
		t.Fatalf("first reply %v, want the mesh name's", resp)
	}
}

// TestBudget: the overall and per-client bounds, and release.
func TestBudget(t *testing.T) {
	a, b, c := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.4")
	bg := newBudget(3, 2)
	steps := []struct {
		name    string
		acquire bool // else release
		client  netip.Addr
		want    bool
	}{
		{"a 1", true, a, true},
		{"a 2", true, a, true},
		{"a over its share", true, a, false},
		{"b 1", true, b, true},
		{"c over the total", true, c, false},
		{"a releases one", false, a, true},
		{"c now fits", true, c, true},
		{"a still over the total", true, a, false},
	}
	for _, st := range steps {
		if !st.acquire {
			bg.release(st.client)
			continue
		}
		if got := bg.acquire(st.client); got != st.want {
			t.Fatalf("%s: acquire %v, want %v", st.name, got, st.want)
		}
	}
	for _, cl := range []netip.Addr{a, b, c} {
		bg.release(cl)
	}
	if bg.total != 0 || len(bg.byClient) != 0 {
		t.Fatalf("after releasing all: total %d, clients %v", bg.total, bg.byClient)
	}
}

// TestDescriptorBudget: the DNS proxy takes its clients' descriptors from
// the daemon's budget (Config.Budget): a client opening TCP connections
// stops at its share (half the budget, fdbudget's rule), its further
// connections are closed at once and counted, and another client's TCP
// query is still answered; when the flooder leaves, the budget is whole.
func TestDescriptorBudget(t *testing.T) {
	budget := fdbudget.New(fdbudget.Config{Total: 40, Floor: 2})
	m := metrics.New(metrics.Config{})
	s := started(t, Config{Budget: budget, Metrics: m, TCPIdleTimeout: time.Hour})
	addr := s.UDPAddrs()[0].String()
	flooder := netip.MustParseAddr("127.0.0.2")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for range 40 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: flooder.AsSlice()}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		// A refused connection is closed at once: its read ends.
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			refused++
		}
	}
	if got := budget.Held(flooder); got != 20 {
		t.Fatalf("the flooder holds %d descriptors, want its share of 20", got)
	}
	if refused != 20 {
		t.Fatalf("%d of the flooder's connections refused, want 20", refused)
	}
	if got := records(exchangeFrom(t, "tcp", "127.0.0.3", addr, "productpage").Answer); !slices.Equal(got, []string{"productpage. A 9.9.9.9"}) {
		t.Fatalf("another client's TCP query: %q", got)
	}
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, f := range fams {
		if f.GetName() == "ztunnel_go_fd_budget_refusals_total" {
			for _, mt := range f.GetMetric() {
				if hasLabels(mt, map[string]string{"listener": "dns", "reason": "peer"}) {
					counted += mt.GetCounter().GetValue()
				}
			}
		}
	}
	if counted != 20 {
		t.Fatalf("refusals counted %v, want 20", counted)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	waitUntil(t, "the budget emptied", func() bool { return budget.Used() == 0 })
}
