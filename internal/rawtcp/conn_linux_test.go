package rawtcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// rawPorts is the source port range the tests use for raw connections;
// the client pod's kernel is kept from resetting their flows.
const rawPorts = "20000:20999"

// veth is a lab node and one pod on its bridge: the raw client in the pod,
// servers in the node, the frames on a real veth pair and bridge.
type veth struct {
	node   *netnslab.Node
	pod    *netnslab.Pod
	gwMAC  net.HardwareAddr // the node's pod bridge
	nextSP uint16
}

func newVeth(t *testing.T) *veth {
	t.Helper()
	lab := netnslab.New(t)
	netnslab.RequireTool(t, "ip6tables", "iptables")
	node, err := lab.AddNode("node")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	if err := pod.EnableIPv6(); err != nil {
		t.Fatal(err)
	}
	mac, err := node.HardwareAddr("cbr0")
	if err != nil {
		t.Fatal(err)
	}
	// The pod's kernel sees the server's SYN-ACK for a port it has no
	// socket on and would reset the connection under us.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		out, err := pod.Command(context.Background(), ipt, "-A", "OUTPUT", "-p", "tcp", "--sport", rawPorts,
			"--tcp-flags", "RST", "RST", "-j", "DROP").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", ipt, err, out)
		}
	}
	return &veth{node: node, pod: pod, gwMAC: mac, nextSP: 20000}
}

// listen serves handle on the node's address of dst's IP version.
func (v *veth) listen(t *testing.T, v6 bool, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	ip := v.node.Gateway()
	if v6 {
		ip = v.node.Gateway6()
	}
	ln, err := v.node.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	nettest.Handle(t, ln, handle)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// config is a raw connection from the pod to dst through the bridge.
func (v *veth) config(dst netip.AddrPort) Config {
	src := v.pod.IP
	if !dst.Addr().Is4() {
		src = v.pod.IP6
	}
	v.nextSP++
	return Config{
		Interface: "eth0", DstMAC: v.gwMAC, Control: v.pod.Do,
		Src: netip.AddrPortFrom(src, v.nextSP), Dst: dst,
	}
}

// TestConnOverVeth runs raw connections from a pod to servers in its node
// over IPv4 and IPv6: the kernel's TCP at the other end accepts our
// handshake and checksums, and we follow its data, FIN and RST.
func TestConnOverVeth(t *testing.T) {
	v := newVeth(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16) // many segments, several windows
	for _, v6 := range []bool{false, true} {
		family := "IPv4"
		if v6 {
			family = "IPv6"
		}
		t.Run(family, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				// handle serves the node's side; nil: no listener.
				handle func(net.Conn)
				// talk drives the raw side after Dial and returns an
				// error if it saw something wrong.
				talk    func(ctx context.Context, c *Conn) error
				wantErr error // from Dial
			}{
				{
					name:   "request and echo, then our reset",
					handle: nettest.Echo,
					talk: func(ctx context.Context, c *Conn) error {
						if err := c.Write(ctx, []byte("hello over a raw socket")); err != nil {
							return err
						}
						var got []byte
						for len(got) < len("hello over a raw socket") {
							b, err := c.Read(ctx)
							if err != nil {
								return err
							}
							got = append(got, b...)
						}
						if string(got) != "hello over a raw socket" {
							return fmt.Errorf("echo %q", got)
						}
						return nil
					},
				},
				{
					name: "large answer then FIN",
					handle: func(c net.Conn) {
						c.Write(big)
						c.Close()
					},
					talk: func(ctx context.Context, c *Conn) error {
						got, err := c.ReadAll(ctx)
						if err != nil {
							return err
						}
						if !bytes.Equal(got, big) {
							return fmt.Errorf("received %d bytes, not the %d sent", len(got), len(big))
						}
						return nil
					},
				},
				{
					name: "the server resets",
					handle: func(c net.Conn) {
						c.Write([]byte("bye"))
						c.(*net.TCPConn).SetLinger(0)
						c.Close()
					},
					talk: func(ctx context.Context, c *Conn) error {
						got, err := c.ReadAll(ctx)
						if !errors.Is(err, ErrReset) {
							return fmt.Errorf("read %q, %v; want ErrReset", got, err)
						}
						return nil
					},
				},
				{name: "nothing listens", wantErr: ErrRefused},
			} {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					var dst netip.AddrPort
					if tc.handle != nil {
						dst = v.listen(t, v6, tc.handle)
					} else {
						// A port nobody listens on: bound and closed.
						dst = v.listen(t, v6, func(net.Conn) {})
						dst = netip.AddrPortFrom(dst.Addr(), closedPort(t, v.node, dst.Addr()))
					}
					c, err := Dial(ctx, v.config(dst))
					if tc.wantErr != nil {
						if !errors.Is(err, tc.wantErr) {
							t.Fatalf("Dial = %v, want %v", err, tc.wantErr)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					if err := tc.talk(ctx, c); err != nil {
						t.Fatalf("%v (%d packets of the flow dropped as malformed)", err, c.Dropped)
					}
				})
			}
		})
	}
}

// closedPort returns a port of ip in ns that nothing listens on.
func closedPort(t *testing.T, ns *netnslab.Node, ip netip.Addr) uint16 {
	t.Helper()
	ln, err := ns.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	ln.Close()
	return port
}

// TestCloseResetsThePeer: Close sends a reset the peer's kernel accepts.
func TestCloseResetsThePeer(t *testing.T) {
	v := newVeth(t)
	got := make(chan error, 1)
	dst := v.listen(t, false, func(c net.Conn) {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.Copy(io.Discard, c)
		got <- err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, v.config(dst))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, []byte("then gone")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the server read until %v, want ECONNRESET", err)
	}
}

// TestDialTimesOut: with no answer at all, Dial retransmits its SYN until
// the context ends and says so.
func TestDialTimesOut(t *testing.T) {
	v := newVeth(t)
	// An address the node does not route: the SYNs vanish.
	dst := netip.MustParseAddrPort("192.0.2.1:80")
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, v.config(dst))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("Dial = %v, want no answer and the context's deadline", err)
	}
}
