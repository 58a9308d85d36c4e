package netnslab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAddressPlan(t *testing.T) {
	l := newLab(t, 2, 2)
	want := map[string]string{
		"pod0-0": "10.244.0.2", "pod0-1": "10.244.0.3",
		"pod1-0": "10.244.1.2", "pod1-1": "10.244.1.3",
	}
	for name, ip := range want {
		if p := mustPod(t, l, name); p.IP.String() != ip {
			t.Errorf("%s IP = %s, want %s", name, p.IP, ip)
		}
	}
	n1, _ := l.Node("node1")
	if n1.IP.String() != "172.30.0.2" || n1.PodCIDR.String() != "10.244.1.0/24" || n1.Gateway().String() != "10.244.1.1" {
		t.Errorf("node1 = %s %s gw %s", n1.IP, n1.PodCIDR, n1.Gateway())
	}
	if got := len(l.Pods()); got != 4 {
		t.Errorf("Pods() has %d pods, want 4", got)
	}
	if _, err := n1.AddPod("pod0-0"); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate pod name: err = %v, want ErrExists", err)
	}
	if _, err := l.AddNode("Bad_Name"); err == nil {
		t.Error("invalid node name accepted")
	}
	// The pod's interfaces, as `ip` sees them from inside.
	out, err := mustPod(t, l, "pod1-1").Command(context.Background(), "ip", "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.244.1.3/24") {
		t.Errorf("ip addr in pod1-1: %v %s", err, out)
	}
}

func TestPodToPod(t *testing.T) {
	l := newLab(t, 2, 2)
	// A node and a pod added after the others must reach them both ways.
	n2, err := l.AddNode("node2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n2.AddPod("pod2-0"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to string }{
		{"cross-node", "pod1-0", "pod0-0"},
		{"same-node", "pod0-1", "pod0-0"},
		{"late-node-to-old", "pod2-0", "pod1-1"},
		{"old-to-late-node", "pod0-1", "pod2-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to := mustPod(t, l, tc.from), mustPod(t, l, tc.to)
			ch := serveOne(t, listen(t, to.NS, to.IP.String()+":8080"))
			src := roundTrip(t, from.NS, dialer(0, netip.Addr{}), netip.AddrPortFrom(to.IP, 8080), tc.name)
			a := await(t, ch, "server")
			// No NAT anywhere between pods: the server sees the client's own address.
			if a.remote != src || a.remote.Addr() != from.IP {
				t.Errorf("server saw %s, client was %s (%s)", a.remote, src, from.IP)
			}
		})
	}
}

func TestNodeToPod(t *testing.T) {
	l := newLab(t, 2, 1)
	n0, _ := l.Node("node0")
	p := mustPod(t, l, "pod1-0")
	ch := serveOne(t, listen(t, p.NS, ":9000"))
	roundTrip(t, n0.NS, dialer(0, netip.Addr{}), netip.AddrPortFrom(p.IP, 9000), "from node")
	if a := await(t, ch, "server"); a.remote.Addr() != n0.IP {
		t.Errorf("server saw %s, want node0 %s", a.remote, n0.IP)
	}
}

func TestCapture(t *testing.T) {
	l := newLab(t, 2, 1)
	c, r := mustPod(t, l, "pod0-0"), mustPod(t, l, "pod1-0")
	if err := c.InstallCapture(); err != nil {
		t.Fatal(err)
	}
	if !c.Captured || r.Captured {
		t.Fatalf("Captured = %v/%v", c.Captured, r.Captured)
	}

	t.Run("outbound", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			mark     int
			to       netip.AddrPort
			captured bool // lands on 15001 in c, else on the listener at tc.to
		}{
			{"remote pod", 0, netip.AddrPortFrom(r.IP, 8080), true},
			{"remote pod, other port", 0, netip.AddrPortFrom(r.IP, 15008), true},
			{"proxy mark 1337 bypasses", PacketMark, netip.AddrPortFrom(r.IP, 8080), false},
			{"own pod IP is not captured", 0, netip.AddrPortFrom(c.IP, 8081), false},
			{"127.0.0.1 is not captured", 0, netip.MustParseAddrPort("127.0.0.1:8082"), false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				proxy := serveOne(t, listen(t, c.NS, ":15001"))
				target := c
				if tc.to.Addr() == r.IP {
					target = r
				}
				direct := serveOne(t, listen(t, target.NS, tc.to.String()))
				roundTrip(t, c.NS, dialer(tc.mark, netip.Addr{}), tc.to, tc.name)
				if !tc.captured {
					a := await(t, direct, "target")
					if a.local != tc.to {
						t.Errorf("target accepted on %s, want %s", a.local, tc.to)
					}
					return
				}
				a := await(t, proxy, "proxy 15001")
				if a.local.Port() != OutboundPort {
					t.Errorf("accepted on %s, want port %d", a.local, OutboundPort)
				}
				if a.origDst != tc.to {
					t.Errorf("SO_ORIGINAL_DST = %s, want %s", a.origDst, tc.to)
				}
				if a.remote.Addr() != c.IP {
					t.Errorf("proxy saw source %s, want the pod %s", a.remote, c.IP)
				}
			})
		}
	})

	t.Run("inbound", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			port     uint16
			captured bool // lands on 15006, else on the listener at the port
		}{
			{"app port goes to 15006", 8080, true},
			{"15008 is not captured", InboundHBONEPort, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				inbound := serveOne(t, listen(t, c.NS, ":15006"))
				direct := serveOne(t, listen(t, c.NS, netip.AddrPortFrom(c.IP, tc.port).String()))
				to := netip.AddrPortFrom(c.IP, tc.port)
				roundTrip(t, r.NS, dialer(0, netip.Addr{}), to, tc.name)
				want, ch := to, direct
				if tc.captured {
					want, ch = netip.AddrPortFrom(c.IP, InboundPlaintextPort), inbound
				}
				a := await(t, ch, "listener")
				if a.local != want {
					t.Errorf("accepted on %s, want %s", a.local, want)
				}
				if tc.captured && a.origDst != to {
					t.Errorf("SO_ORIGINAL_DST = %s, want %s", a.origDst, to)
				}
				if a.remote.Addr() != r.IP {
					t.Errorf("source %s, want %s", a.remote, r.IP)
				}
			})
		}
	})

	// What ztunnel's inbound passthrough does: connect to the local app from a
	// transparent, marked socket spoofing the remote peer. The app's replies go to
	// the remote address, and only the connmark + table 100 bring them back.
	t.Run("original source to local app", func(t *testing.T) {
		app := serveOne(t, listen(t, c.NS, ":8080"))
		roundTrip(t, c.NS, dialer(PacketMark, r.IP), netip.AddrPortFrom(c.IP, 8080), "spoofed")
		if a := await(t, app, "app"); a.remote.Addr() != r.IP {
			t.Errorf("app saw source %s, want the spoofed %s", a.remote, r.IP)
		}
	})
}

// TestCaptureIPv6: with CaptureOptions.IPv6 and IPv6 addresses on the
// pods, the IPv6 rules capture as the IPv4 ones do: inbound to an app port
// lands on 15006, 15008 is left alone, outbound lands on 15001, ::1 is
// exempt.
func TestCaptureIPv6(t *testing.T) {
	l := newLab(t, 1, 2)
	RequireTool(t, "ip6tables-restore", "iptables")
	c, r := mustPod(t, l, "pod0-0"), mustPod(t, l, "pod0-1")
	for _, p := range []*Pod{c, r} {
		if err := p.EnableIPv6(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.EnableIPv6(); err != nil {
		t.Errorf("second EnableIPv6: %v", err)
	}
	if want := netip.MustParseAddr("fd00:10:244::3"); r.IP6 != want {
		t.Errorf("pod0-1's IPv6 address %s, want %s", r.IP6, want)
	}
	if err := c.InstallCaptureWith(CaptureOptions{IPv6: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		from *Pod
		to   netip.AddrPort
		// lands is the port of the listener in c that must accept.
		lands uint16
	}{
		{"inbound app port goes to 15006", r, netip.AddrPortFrom(c.IP6, 8080), InboundPlaintextPort},
		{"inbound 15008 is not captured", r, netip.AddrPortFrom(c.IP6, InboundHBONEPort), InboundHBONEPort},
		{"outbound goes to 15001", c, netip.AddrPortFrom(r.IP6, 8080), OutboundPort},
		{"::1 is not captured", c, netip.MustParseAddrPort("[::1]:8082"), 8082},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := c.Listen("tcp6", fmt.Sprintf("[::]:%d", tc.lands))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			if tc.to.Port() != tc.lands && tc.to.Addr() == r.IP6 {
				// The uncaptured destination listens too: the proxy
				// must win anyway.
				listen6(t, r.NS, tc.to)
			}
			ch := serveOne(t, ln)
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			conn, err := tc.from.Dial(ctx, "tcp6", tc.to.String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(deadline())
			if _, err := conn.Write([]byte("v6")); err != nil {
				t.Fatal(err)
			}
			if got, err := io.ReadAll(conn); err != nil || string(got) != "echo:v6" {
				t.Fatalf("echo %q, %v", got, err)
			}
			if a := await(t, ch, "listener"); a.local.Port() != tc.lands {
				t.Errorf("accepted on %s, want port %d", a.local, tc.lands)
			}
		})
	}
	if err := c.RemoveCapture(); err != nil {
		t.Fatal(err)
	}
	out, err := c.Command(context.Background(), "ip6tables-save", "-t", "nat").CombinedOutput()
	if err != nil || strings.Contains(string(out), "ISTIO") {
		t.Fatalf("IPv6 rules after RemoveCapture: %v\n%s", err, out)
	}
}

func listen6(t *testing.T, ns NS, addr netip.AddrPort) {
	t.Helper()
	ln, err := ns.Listen("tcp6", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
}

func TestCaptureDNSAndIdempotence(t *testing.T) {
	l := newLab(t, 1, 2)
	c, r := mustPod(t, l, "pod0-0"), mustPod(t, l, "pod0-1")
	opts := CaptureOptions{RedirectDNS: true}
	if err := c.InstallCaptureWith(opts); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCaptureWith(opts); err != nil {
		t.Errorf("second install with the same options: %v", err)
	}
	if err := c.InstallCapture(); !errors.Is(err, ErrCaptureInstalled) {
		t.Errorf("install with other options: err = %v, want ErrCaptureInstalled", err)
	}
	out, err := c.Command(context.Background(), "iptables-save", "-t", "nat").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v %s", err, out)
	}
	if n := strings.Count(string(out), "--to-ports 15001"); n != 1 {
		t.Errorf("%d outbound REDIRECT rules, want 1:\n%s", n, out)
	}
	if n := strings.Count(string(out), "--to-ports 15053"); n != 2 {
		t.Errorf("%d DNS REDIRECT rules, want 2:\n%s", n, out)
	}
	out, err = c.Command(context.Background(), "ip", "rule", "show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fwmark 0x111/0xfff lookup 100") {
		t.Errorf("ip rule: %v\n%s", err, out)
	}

	// A UDP DNS query to another pod lands on the pod's own 15053.
	dns, err := c.ListenPacket("udp4", ":15053")
	if err != nil {
		t.Fatal(err)
	}
	defer dns.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	q, err := c.Dial(ctx, "udp4", netip.AddrPortFrom(r.IP, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	dns.SetReadDeadline(deadline())
	n, from, err := dns.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "query" {
		t.Fatalf("15053 read %q from %v: %v", buf[:n], from, err)
	}
}

func TestDo(t *testing.T) {
	l := newLab(t, 1, 1)
	p := mustPod(t, l, "pod0-0")
	var want, got, outside unix.Stat_t
	if err := unix.Stat(p.Path(), &want); err != nil {
		t.Fatal(err)
	}
	if err := p.Do(func() error { return unix.Stat("/proc/thread-self/ns/net", &got) }); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino {
		t.Errorf("inside Do: netns inode %d, want the pod's %d", got.Ino, want.Ino)
	}
	runtime.LockOSThread()
	err := unix.Stat("/proc/thread-self/ns/net", &outside)
	runtime.UnlockOSThread()
	if err != nil || outside.Ino == want.Ino {
		t.Errorf("caller thread is in the pod netns (err %v)", err)
	}

	sentinel := errors.New("fn failed")
	if err := p.Do(func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do error = %v, want %v", err, sentinel)
	}
	if err := p.Do(func() error { runtime.Goexit(); return nil }); !errors.Is(err, errGoexit) {
		t.Errorf("Do after Goexit = %v, want errGoexit", err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "boom") {
				t.Errorf("recovered %v, want the panic from fn", r)
			}
		}()
		_ = p.Do(func() error { panic("boom") })
	}()
	if err := (NS{NetNS: "zl-does-not-exist"}).Do(func() error { return nil }); err == nil {
		t.Error("Do in a missing namespace succeeded")
	}
}

func TestTopologyJSON(t *testing.T) {
	l := newLab(t, 2, 2)
	if err := mustPod(t, l, "pod1-1").InstallCapture(); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(l.Topology())
	if err != nil {
		t.Fatal(err)
	}
	topo, err := ParseTopology(data)
	if err != nil {
		t.Fatal(err)
	}
	if topo.Prefix != l.Prefix() || topo.NetNS != l.Net().NetNS || len(topo.Nodes) != 2 || len(topo.Pods()) != 4 {
		t.Fatalf("round trip: %s", data)
	}
	p := topo.Pods()[3]
	if p.Name != "pod1-1" || !p.Captured || p.Node != topo.Nodes[1] || p.IP != mustPod(t, l, "pod1-1").IP {
		t.Errorf("decoded pod: %+v", p)
	}
	if ns, ok := topo.Lookup("node1"); !ok || ns.NetNS != l.Prefix()+"_node1" {
		t.Errorf("Lookup(node1) = %v, %v", ns, ok)
	}
	// A decoded pod still works as a namespace, but is not part of a live lab.
	if err := p.Do(func() error { return nil }); err != nil {
		t.Errorf("Do on a decoded pod: %v", err)
	}
	if err := p.InstallCapture(); !errors.Is(err, ErrNotInLab) {
		t.Errorf("InstallCapture on a decoded pod: %v", err)
	}
}

// Tests below need no root.

func TestCaptureRules(t *testing.T) {
	rules := CaptureRules(CaptureOptions{})
	for _, want := range []string{
		"-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
		"-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
		"-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
		"-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
		"-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
		"-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT",
		"-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT",
		"-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
	} {
		if !strings.Contains(rules, want+"\n") {
			t.Errorf("rules lack %q", want)
		}
	}
	if strings.Contains(rules, "15053") {
		t.Error("DNS rules without RedirectDNS")
	}
	if dns := CaptureRules(CaptureOptions{RedirectDNS: true}); strings.Count(dns, "--to-ports 15053") != 2 {
		t.Errorf("RedirectDNS rules:\n%s", dns)
	}
	// Order matters in nat OUTPUT: the exemptions precede the REDIRECT to 15001.
	if strings.Index(rules, "-o lo -j ACCEPT") > strings.Index(rules, "--to-ports 15001") {
		t.Error("lo exemption after the outbound REDIRECT")
	}
}

func TestCaptureRules6(t *testing.T) {
	rules := CaptureRules6(CaptureOptions{RedirectDNS: true})
	for _, want := range []string{
		"-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128 -p tcp -m tcp -j ACCEPT",
		"-A ISTIO_PRERT ! -d ::1/128 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
		"-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053",
		"-A ISTIO_OUTPUT ! -d ::1/128 -o lo -j ACCEPT",
		"-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
	} {
		if !strings.Contains(rules, want+"\n") {
			t.Errorf("IPv6 rules lack %q", want)
		}
	}
	if strings.Contains(rules, "127.0.0.1") || strings.Contains(rules, "169.254.7.127") {
		t.Errorf("IPv6 rules name IPv4 addresses:\n%s", rules)
	}
}

func TestValidation(t *testing.T) {
	for _, p := range []string{"", "zl-", "demo", "zl-a_b", "zl-UPPER", "zl-" + strings.Repeat("a", 25)} {
		if _, err := NewLab(p); err == nil {
			t.Errorf("NewLab(%q) accepted", p)
		}
	}
	if _, err := CleanupStale("other-"); err == nil {
		t.Error("CleanupStale outside GlobalPrefix accepted")
	}
	if got := labOf("zl-x1_pod0-0"); got != "zl-x1" {
		t.Errorf("labOf = %q", got)
	}
	if got := labOf("zl-x1"); got != "zl-x1" {
		t.Errorf("labOf(net) = %q", got)
	}
	for addr, ok := range map[string]bool{
		"10.0.0.1:80": true, "[::1]:80": true, ":80": true, "example.com:80": false, "10.0.0.1": false,
	} {
		if err := requireIPLiteral("tcp", addr); (err == nil) != ok {
			t.Errorf("requireIPLiteral(%q) = %v", addr, err)
		}
	}
	if err := (NS{}).Do(func() error { return nil }); !errors.Is(err, ErrNoNetNS) {
		t.Errorf("Do on zero NS: %v", err)
	}
	if _, err := (NS{}).Dial(context.Background(), "tcp", "127.0.0.1:1"); !errors.Is(err, ErrNoNetNS) {
		t.Errorf("Dial on zero NS: %v", err)
	}
	if err := ExecIn(context.Background(), "", "true").Run(); !errors.Is(err, ErrNoNetNS) {
		t.Errorf("ExecIn with no netns: %v", err)
	}

}

// TestGatewayMACStable: a node's pod bridge keeps its MAC address while
// pods come and go (a Linux bridge without an address of its own takes its
// lowest port's and follows it, which would leave every pod's ARP entry for
// the gateway pointing nowhere: traffic through the gateway stalls for
// seconds, as daemon pods come and go in the upgrade tests). The pods'
// neighbour entries are never flushed here, so a changed MAC fails the
// prompt round trip after it.
func TestGatewayMACStable(t *testing.T) {
	l := newLab(t, 2, 1)
	n0, _ := l.Node("node0")
	client, server := mustPod(t, l, "pod1-0"), mustPod(t, l, "pod0-0")
	mac := func() string {
		t.Helper()
		out, err := exec.Command("ip", "-n", n0.NetNS, "-br", "link", "show", "cbr0").CombinedOutput()
		if err != nil {
			t.Fatalf("ip link show cbr0: %v: %s", err, out)
		}
		f := strings.Fields(string(out))
		if len(f) < 3 {
			t.Fatalf("ip link show cbr0: %q", out)
		}
		return f[2]
	}
	want := mac()
	ch := serveOne(t, listen(t, server.NS, server.IP.String()+":8080"))
	roundTrip(t, client.NS, dialer(0, netip.Addr{}), netip.AddrPortFrom(server.IP, 8080), "before")
	await(t, ch, "server")
	var added []*Pod
	for i := range 8 {
		p, err := n0.AddPod(fmt.Sprintf("churn-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		added = append(added, p)
		if got := mac(); got != want {
			t.Fatalf("pod %d added: cbr0's MAC moved from %s to %s", i, want, got)
		}
	}
	for i, p := range added {
		if err := p.Delete(); err != nil {
			t.Fatal(err)
		}
		if got := mac(); got != want {
			t.Fatalf("pod %d deleted: cbr0's MAC moved from %s to %s", i, want, got)
		}
	}
	ch = serveOne(t, listen(t, server.NS, server.IP.String()+":8081"))
	roundTrip(t, client.NS, dialer(0, netip.Addr{}), netip.AddrPortFrom(server.IP, 8081), "after")
	await(t, ch, "server")
}

// TestRemoveCapture: after RemoveCapture the pod's outbound TCP reaches its
// destination directly, its iptables and the original-source route are gone,
// and the capture can be installed again.
func TestRemoveCapture(t *testing.T) {
	l := newLab(t, 1, 2)
	c, r := mustPod(t, l, "pod0-0"), mustPod(t, l, "pod0-1")
	to := netip.AddrPortFrom(r.IP, 8080)
	if err := c.InstallCapture(); err != nil {
		t.Fatal(err)
	}
	proxy := serveOne(t, listen(t, c.NS, ":15001"))
	roundTrip(t, c.NS, dialer(0, netip.Addr{}), to, "captured")
	if a := await(t, proxy, "proxy 15001"); a.origDst != to {
		t.Fatalf("captured to %s, want %s", a.origDst, to)
	}
	if err := c.RemoveCapture(); err != nil {
		t.Fatal(err)
	}
	if c.Captured {
		t.Fatal("Captured still set after RemoveCapture")
	}
	direct := serveOne(t, listen(t, r.NS, to.String()))
	roundTrip(t, c.NS, dialer(0, netip.Addr{}), to, "uncaptured")
	if a := await(t, direct, "target"); a.local != to {
		t.Fatalf("target accepted on %s, want %s", a.local, to)
	}
	show := func() string {
		var b strings.Builder
		for _, args := range [][]string{{"iptables-save"}, {"ip", "rule"}, {"ip", "route", "show", "table", "100"}} {
			out, err := c.Command(context.Background(), args[0], args[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v %s", args, err, out)
			}
			b.Write(out)
		}
		return b.String()
	}
	if s := show(); strings.Contains(s, "ISTIO_") || strings.Contains(s, "lookup 100") || strings.Contains(s, "local default") {
		t.Fatalf("the capture is still there:\n%s", s)
	}
	if err := c.RemoveCapture(); err != nil {
		t.Errorf("RemoveCapture without capture: %v", err)
	}
	if err := c.InstallCapture(); err != nil {
		t.Fatalf("capture installed again: %v", err)
	}
	if s := show(); !strings.Contains(s, "ISTIO_PRERT") || !strings.Contains(s, "lookup 100") {
		t.Fatalf("the capture installed again is incomplete:\n%s", s)
	}
}
