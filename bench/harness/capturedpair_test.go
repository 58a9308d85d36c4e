package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// TestHAProxyCapturedPair runs the HAProxy pair behind the capture rules
// for real, in two captured pods on two nodes: a connection the client
// pod makes to either of the server pod's app ports reaches that port
// (the original destination crossed the tunnel in the PROXY header), and
// the app sees the client pod's address (usesrc clientip, replies routed
// back by the capture rules' connmark). Without the pair nothing could
// answer: the client pod's rules redirect every outbound connection to
// 15001, and the server pod's redirect the apps' ports to 15006. The
// captured terminator likewise: our mTLS client's connection reaches the
// app from the client's own address.
func TestHAProxyCapturedPair(t *testing.T) {
	lab := netnslab.New(t)
	path, err := exec.LookPath("haproxy")
	if err != nil {
		netnslab.Skip(t, "haproxy is not installed (scripts/deps.sh test installs it)")
	}
	nodes := map[string]*netnslab.Node{}
	for _, n := range []string{"a", "b"} {
		node, err := lab.AddNode("n" + n)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n] = node
	}
	pod := func(node, name string, captured bool) *netnslab.Pod {
		p, err := nodes[node].AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if captured {
			if err := p.InstallCapture(); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	cli, srv := pod("a", "pa", true), pod("b", "pb", true)
	plain, term := pod("a", "pc", false), pod("b", "pt", true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newTestBench(t, path)

	// The apps: on each port, a line naming the port and the peer's
	// address, then an echo of one line.
	for _, p := range []*netnslab.Pod{srv, term} {
		for _, port := range capturedPairPorts {
			ln, err := p.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			serveEach(t, ln, func(c net.Conn) {
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "port %d from %s\n", port, strings.TrimPrefix(host, "::ffff:"))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					_, _ = c.Write([]byte(line))
				}
			})
		}
	}
	// check reads the app's line and an echo over c.
	check := func(t *testing.T, c net.Conn, port int, from netip.Addr) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(c)
		hello, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("port %d from %s\n", port, from); hello != want {
			t.Fatalf("the app said %q, want %q", hello, want)
		}
		msg := strings.Repeat("captured ", 500) + "\n"
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got != msg {
			t.Fatal("the echo came back changed")
		}
	}
	if _, _, err := b.startCapturedPair(ctx, cli, srv); err != nil {
		t.Fatal(err)
	}
	for _, port := range capturedPairPorts {
		t.Run(fmt.Sprintf("pair to %d", port), func(t *testing.T) {
			c, err := cli.Dial(ctx, "tcp", fmt.Sprintf("%s:%d", srv.IP, port))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			check(t, c, port, cli.IP)
		})
	}
	// The terminator: our mTLS client in a plain pod, as zload on hbone1.
	if _, err := b.startCapturedTerminator(ctx, term); err != nil {
		t.Fatal(err)
	}
	t.Run("terminator", func(t *testing.T) {
		wc, err := load.LoadCert(ctx, load.CertConfig{CACert: b.caCert, CAKey: b.caKey, Identity: spiffe(zloadSA)})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := plain.Dial(ctx, "tcp", netip.AddrPortFrom(term.IP, netnslab.InboundHBONEPort).String())
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(raw, mtls.ClientConfig(wc, []string{spiffe(peerServerSA)}))
		defer tc.Close()
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatal(err)
		}
		check(t, tc, appPort, plain.IP)
	})
}
