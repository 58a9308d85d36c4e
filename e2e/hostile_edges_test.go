package e2e

// Issue 32's attacks on the plaintext paths, made as an attacker makes them
// (hostile_kit_test.go): the inbound plaintext listener (15006) dialling the
// pod's loopback and relaying to any address, and the outbound listener
// (15001) dialling itself.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

const (
	// loopbackPort is where the target pod runs a service on its
	// loopback only, 127.0.0.1 and ::1 (its banner says so).
	loopbackPort   = 9999
	loopbackBanner = "SECRET: a service on the pod's loopback only\n"
	// vaultPort is the vault's marker service, which only target may use.
	vaultPort   = 7777
	vaultBanner = "VAULT: only the target pod may read this\n"
	// relaySrcPort is the attacker's port for the relay attack.
	relaySrcPort = rawPortLast + 1
	// rawLimit bounds one raw attack: the daemon refuses at once, or
	// today relays within this (a relay to a host whose answer cannot
	// reach the spoofed source waits out the 10 s connect timeout before
	// falling back to the pod's own address).
	rawLimit = 15 * time.Second
)

// TestHostilePlaintext runs issue 32's attacks on the plaintext paths
// against dedicated and shared daemons:
//
//   - inbound to the pod's loopback: raw SYNs from the attacker (a pod on
//     target's bridge, in no mesh) to 0.0.0.0:P, [::ffff:127.0.0.1]:P and
//     [::]:P, which Istio's capture rules redirect to 15006 (they exempt
//     only 127.0.0.1/32 and ::1/128), where P is a service on target's
//     loopback only, and in dedicated mode the daemon's own admin port
//     15000 (GET /config_dump; POST /quitquitquit last, after which the
//     daemon must still be alive and ready);
//   - inbound relay to any address: the attacker routes the vault's address
//     (a host only target may reach) via target and connect()s to it;
//   - outbound self-loops: an app connects to its own pod's IP:15001, in an
//     HBONE workload, in a TCP workload, and through SOCKS5, while the
//     daemon's descriptors are counted and an honest client is served.
//
// Each refusal must come without a byte of the forbidden service, must be
// logged naming the attacker's connection, and the daemon must keep serving
// an honest client.
func TestHostilePlaintext(t *testing.T) {
	for _, mode := range hostileModes {
		t.Run(mode, func(t *testing.T) {
			// A low descriptor limit bounds what an unchecked self-loop
			// can take (it goes as deep as the limit lets it).
			h := startHostile(t, mode, hostileOptions{noFile: 1024})
			t.Run("inbound to the pod's loopback", func(t *testing.T) { h.loopbackAttacks(t) })
			t.Run("inbound relay to any address", func(t *testing.T) { h.relayAttack(t) })
			t.Run("outbound self-loop", func(t *testing.T) { h.selfLoops(t) })
			if mode == "dedicated" {
				t.Run("inbound to the admin port: quitquitquit", func(t *testing.T) { h.quitAttack(t) })
			}
		})
	}
}

// loopbackAttacks sends raw connections from the attacker to destinations
// that the target's kernel routes to its loopback once the daemon dials
// them.
func (h *hostileLab) loopbackAttacks(t *testing.T) {
	target := h.pods["target"]
	d := h.daemons["target"]
	bannerServer(t, target, "tcp4", fmt.Sprintf("127.0.0.1:%d", loopbackPort), loopbackBanner)
	bannerServer(t, target, "tcp6", fmt.Sprintf("[::1]:%d", loopbackPort), loopbackBanner)

	// The service is there, and the attacker cannot reach it the honest
	// way: to the pod's address it is not listening.
	t.Run("baseline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := target.Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", loopbackPort))
		if err != nil {
			t.Fatal(err)
		}
		got, err := readBanner(c, len(loopbackBanner))
		c.Close()
		if got != loopbackBanner {
			t.Fatalf("the loopback service from inside the pod: %q, %v", got, err)
		}
		c, err = h.pods["attacker"].Dial(ctx, "tcp", netip.AddrPortFrom(target.IP, loopbackPort).String())
		got = ""
		if err == nil {
			got, _ = readBanner(c, len(loopbackBanner))
			c.Close()
		}
		if got != "" {
			t.Fatalf("the attacker reached the loopback service at the pod's address: %q", got)
		}
	})

	type rawCase struct {
		name string
		dst  netip.AddrPort
		req  string
	}
	// Three spellings the daemon's dial turns into its loopback: 0.0.0.0
	// (connect() takes it for 127.0.0.1), the v4-mapped 127.0.0.1 (the
	// original destination is unmapped), and :: (::1).
	var cases []rawCase
	for _, ip := range []string{"0.0.0.0", "::ffff:127.0.0.1", "::"} {
		cases = append(cases, rawCase{ip + " to a loopback service", netip.AddrPortFrom(netip.MustParseAddr(ip), loopbackPort), ""})
	}
	if h.mode == "dedicated" {
		// The daemon's admin server shares the pod's loopback.
		for _, ip := range []string{"0.0.0.0", "::ffff:127.0.0.1", "::"} {
			cases = append(cases, rawCase{ip + " to the admin port", netip.AddrPortFrom(netip.MustParseAddr(ip), 15000),
				"GET /config_dump HTTP/1.1\r\nHost: localhost\r\n\r\n"})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := h.raw(t, tc.dst, tc.req, rawLimit)
			t.Logf("%s -> %s: %v", o.src, tc.dst, o)
			switch {
			case strings.Contains(string(o.data), "SECRET"):
				t.Fatalf("the attacker read the loopback-only service through 15006: %q", o.data)
			case strings.HasPrefix(string(o.data), "HTTP/"):
				t.Fatalf("the daemon's admin server answered the attacker through 15006: %.200q", o.data)
			case !o.refused():
				t.Fatalf("want the connection refused (closed or reset, no data); got %v", o)
			}
			waitRefusalLogged(t, d, o.src)
		})
	}
	t.Run("an honest client is still served", func(t *testing.T) {
		if err := h.honestRoundTrip(t, h.echo.Addr); err != nil {
			t.Fatal(err)
		}
	})
}

// readBanner reads up to n bytes within a few seconds.
func readBanner(c net.Conn, n int) (string, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	return string(buf[:got]), err
}

// relayAttack routes the vault's address via target from the attacker and
// connects to it: the target's capture rules take the SYN to 15006, whose
// original destination is the vault.
func (h *hostileLab) relayAttack(t *testing.T) {
	attacker, target, vault := h.pods["attacker"], h.pods["target"], h.pods["vault"]
	marker := bannerServer(t, vault, "tcp4", fmt.Sprintf("0.0.0.0:%d", vaultPort), vaultBanner)
	vaultAddr := netip.AddrPortFrom(vault.IP, vaultPort)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The vault lets target in and resets everyone else, as a database's
	// network policy would.
	for _, rule := range [][]string{
		{"-A", "INPUT", "-p", "tcp", "--dport", fmt.Sprint(vaultPort), "-s", target.IP.String(), "-j", "ACCEPT"},
		{"-A", "INPUT", "-p", "tcp", "--dport", fmt.Sprint(vaultPort), "-j", "REJECT", "--reject-with", "tcp-reset"},
	} {
		if out, err := vault.Command(ctx, "iptables", rule...).CombinedOutput(); err != nil {
			t.Fatalf("iptables in the vault: %v: %s", err, out)
		}
	}

	t.Run("baseline: the attacker cannot reach the vault, target can", func(t *testing.T) {
		c, err := attacker.Dial(ctx, "tcp", vaultAddr.String())
		if err == nil {
			got, _ := readBanner(c, len(vaultBanner))
			c.Close()
			t.Fatalf("the attacker reached the vault directly: %q", got)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("the attacker's own connection: %v, want it refused", err)
		}
		c, err = target.Dial(ctx, "tcp", vaultAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		got, err := readBanner(c, len(vaultBanner))
		c.Close()
		if got != vaultBanner {
			t.Fatalf("target to the vault: %q, %v", got, err)
		}
	})

	t.Run("via target's 15006", func(t *testing.T) {
		route := fmt.Sprintf("%s/32", vault.IP)
		if out, err := attacker.Command(ctx, "ip", "route", "add", route, "via", target.IP.String()).CombinedOutput(); err != nil {
			t.Fatalf("ip route add: %v: %s", err, out)
		}
		defer attacker.Command(context.Background(), "ip", "route", "del", route).Run()
		before := len(marker.Peers())
		// A source port of our choosing (outside the raw flows' range,
		// whose resets the attacker's kernel drops), so that the refusal
		// can be found in the log even when the dial itself sees it.
		src := netip.AddrPortFrom(attacker.IP, relaySrcPort)
		c, err := attacker.DialWith(ctx, &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(src)}, "tcp", vaultAddr.String())
		var got []byte
		switch {
		case errors.Is(err, syscall.ECONNRESET):
			// Accepted by 15006 and reset before the dial looked.
		case err != nil:
			t.Fatalf("the attacker's connection via target: %v, want it accepted by 15006 and then refused", err)
		default:
			defer c.Close()
			// Until the first bytes (what the attacker is after), the
			// end, or the limit.
			c.SetReadDeadline(time.Now().Add(rawLimit))
			buf := make([]byte, 512)
			var n int
			n, err = c.Read(buf)
			got = buf[:n]
		}
		t.Logf("%s -> %s via %s: %q, then %v", src, vaultAddr, target.IP, got, err)
		switch {
		case strings.Contains(string(got), "VAULT"):
			t.Fatalf("target's daemon relayed the attacker to the vault: %q", got)
		case len(got) > 0:
			t.Fatalf("the attacker's connection delivered %q; want it refused", got)
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("the connection hangs (read %q); want it refused", got)
		case len(marker.Peers()) != before:
			t.Fatalf("the vault saw a connection during the attack (peers %v)", marker.Peers())
		}
		waitRefusalLogged(t, h.daemons["target"], src)
	})

	t.Run("an honest client is still served", func(t *testing.T) {
		if err := h.honestRoundTrip(t, h.echo.Addr); err != nil {
			t.Fatal(err)
		}
	})
}

// selfLoops connects apps to their own pod's 15001: directly (the capture
// rules leave a pod's traffic to its own address alone, so the outbound
// listener sees its own address as the original destination) and through
// the SOCKS5 listener. Each must be refused at once: the daemon's
// descriptors stay where they were, and an honest client gets through
// the same daemon meanwhile.
func (h *hostileLab) selfLoops(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pod   string
		socks bool
	}{
		{"HBONE workload to its own IP:15001", "target", false},
		{"TCP workload to its own IP:15001", "tcpapp", false},
		{"SOCKS5 in an HBONE workload to its own IP:15001", "target", true},
		{"SOCKS5 in a TCP workload to its own IP:15001", "tcpapp", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, d := h.pods[tc.pod], h.daemons[tc.pod]
			self := netip.AddrPortFrom(pod.IP, 15001)
			// What an earlier case left behind has unwound first.
			before := int(settle(func() int64 { n, _ := fdCount(d); return int64(n) }))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var conn net.Conn
			var err error
			if tc.socks {
				conn, err = pod.Dial(ctx, "tcp", "127.0.0.1:15080")
				if err == nil {
					conn.SetDeadline(time.Now().Add(5 * time.Second))
					var rep socks5.Reply
					rep, err = socks5.ClientHandshake(conn, socks5.Target{Addr: self})
					t.Logf("SOCKS5 CONNECT %s: reply %d, %v", self, rep, err)
				}
			} else {
				conn, err = pod.Dial(ctx, "tcp", self.String())
			}
			// An honest client through the same daemon meanwhile.
			honest := make(chan error, 1)
			go func() { honest <- h.honestRoundTrip(t, netip.AddrPortFrom(pod.IP, 8080)) }()
			// Count the daemon's descriptors while the app waits for an
			// answer that must not come, and for half a second at least
			// (a loop runs in the daemon whatever the app's end saw).
			peak := before
			var got []byte
			var rerr error
			done := make(chan struct{})
			if conn != nil {
				defer conn.Close()
				go func() {
					defer close(done)
					conn.SetDeadline(time.Now().Add(3 * time.Second))
					if _, werr := conn.Write([]byte("ping")); werr != nil {
						rerr = werr
						return
					}
					got, rerr = io.ReadAll(conn)
				}()
			} else {
				close(done)
			}
			for watch := time.Now().Add(500 * time.Millisecond); ; time.Sleep(20 * time.Millisecond) {
				if n, err := fdCount(d); err == nil && n > peak {
					peak = n
				}
				finished := false
				select {
				case <-done:
					finished = true
				default:
				}
				if finished && time.Now().After(watch) {
					break
				}
			}
			herr := <-honest
			t.Logf("dial %v; app read %q, %v; daemon descriptors %d before, %d at the peak; honest client: %v",
				err, got, rerr, before, peak, herr)
			if len(got) > 0 {
				t.Errorf("the self-call got an answer: %q", got)
			}
			if errors.Is(rerr, os.ErrDeadlineExceeded) {
				t.Errorf("the self-call hangs instead of being refused")
			}
			// A refused self-call holds a few descriptors for a moment; a
			// loop takes one pair per hop until the limit.
			if peak-before > 32 {
				t.Errorf("the daemon's descriptors went from %d to %d: the self-call loops", before, peak)
			}
			if herr != nil {
				t.Errorf("an honest client through the same daemon: %v", herr)
			}
			if t.Failed() {
				t.Logf("daemon log tail:\n%s", logTail(d, 4000))
			}
		})
	}
}

// quitAttack sends POST /quitquitquit to the dedicated daemon's admin port
// through 15006 as the loopback attacks do, then checks the daemon is
// alive, ready and serving. It runs last: today the daemon dies of it.
func (h *hostileLab) quitAttack(t *testing.T) {
	d := h.daemons["target"]
	post := "POST /quitquitquit HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
	for _, ip := range []string{"0.0.0.0", "::ffff:127.0.0.1", "::"} {
		dst := netip.AddrPortFrom(netip.MustParseAddr(ip), 15000)
		o := h.raw(t, dst, post, rawLimit)
		t.Logf("%s -> %s: %v", o.src, dst, o)
		if strings.HasPrefix(string(o.data), "HTTP/") {
			t.Errorf("the admin server answered the attacker's quitquitquit: %.200q", o.data)
		}
	}
	// A quitquitquit that got through drains the daemon (readiness
	// fails) and ends it within its termination deadline (2 s here).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.WaitReady(ctx, 5*time.Second); err != nil {
		t.Fatalf("the daemon is not ready after the attacker's quitquitquit: %v\n%s", err, logTail(d, 4000))
	}
	if err := h.honestRoundTrip(t, h.echo.Addr); err != nil {
		t.Fatal(err)
	}
}
