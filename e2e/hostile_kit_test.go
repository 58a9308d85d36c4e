package e2e

// The set-up the attacker tests of issue 32 ("Hostile edges") share:
// hostile_edges_test.go (plaintext inbound to the pod's loopback, relays to
// any address, outbound self-loops) and hostile_fds_test.go (descriptor
// exhaustion per listener). Each attack is made as an attacker makes it:
// from a pod of the lab that is in no mesh, with raw packets where the
// kernel would refuse to connect() (internal/rawtcp), through the real
// daemons, in dedicated and in shared mode.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/internal/rawtcp"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// hostileConfig is the mesh under attack: target (HBONE) and tcpapp (a
// TCP workload whose pod is nevertheless captured and served, as a pod
// enrolled in ambient before its workload record says HBONE) on node-a,
// honest (HBONE) on node-b; target backs the service web (a mesh name the
// DNS proxy answers itself). The lab adds pods in no mesh: the attacker on
// node-a (10.244.0.4, on target's bridge), and on node-b the vault (a host
// only target may reach, 10.244.1.3) and the prober (an outside HBONE
// client with a certificate of the mesh's CA, 10.244.1.4). In shared mode
// each node's ztunnel pod comes after them.
const hostileConfig = `
workloads:
- {uid: u-target, name: target, namespace: default, serviceAccount: target, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {"default/web.default.svc.cluster.local": {80: 8080}}}
- {uid: u-tcpapp, name: tcpapp, namespace: default, serviceAccount: tcpapp, workloadIps: ["10.244.0.3"], protocol: TCP, node: node-a, services: {}}
- {uid: u-honest, name: honest, namespace: default, serviceAccount: honest, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {}}
services:
- {name: web, namespace: default, hostname: web.default.svc.cluster.local, vips: ["/10.96.0.10"], ports: {80: 8080}}
`

// hostileModes are the two ways the daemons run.
var hostileModes = []string{"dedicated", "shared"}

// rawPortFirst and rawPortLast bound the source ports of the attacker's
// raw connections; its kernel is kept from resetting their flows.
const rawPortFirst, rawPortLast = 20000, 20999

// hostileLab is hostileConfig running in one mode.
type hostileLab struct {
	mode string
	ca   *caclient.BuiltinCA
	pods map[string]*netnslab.Pod
	// daemons maps a meshed pod to the daemon serving it.
	daemons map[string]*labrun.Daemon
	// echo is target's echo app on 8080, tcpEcho tcpapp's.
	echo, tcpEcho *labrun.EchoServer
	rawPort       atomic.Uint32
}

// hostileOptions tune startHostile.
type hostileOptions struct {
	// noFile is every daemon's RLIMIT_NOFILE (0: inherited).
	noFile uint64
	// env adds to every daemon's environment.
	env []string
	// dnsCapture installs istio-cni's DNS capture rules too.
	dnsCapture bool
}

// startHostile builds hostileConfig in mode ("dedicated": a daemon per
// meshed pod; "shared": a daemon per node), meshes tcpapp too, gives
// target, tcpapp and the attacker IPv6 addresses (IPv6 capture rules are
// on), starts the echo apps and stops everything when the test ends.
func startHostile(t *testing.T, mode string, o hostileOptions) *hostileLab {
	t.Helper()
	lab := netnslab.New(t)
	netnslab.RequireTool(t, "ip6tables-restore", "iptables") // the IPv6 capture rules
	if o.noFile != 0 {
		netnslab.RequireTool(t, "prlimit", "util-linux")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	capture := netnslab.CaptureOptions{IPv6: true, RedirectDNS: o.dnsCapture}
	extra := map[string][]string{"node-a": {"attacker"}, "node-b": {"vault", "prober"}}
	env := append([]string{"UNSTABLE_ENABLE_SOCKS5=true"}, o.env...)
	h := &hostileLab{mode: mode, daemons: map[string]*labrun.Daemon{}}
	switch mode {
	case "dedicated":
		c := startCluster(ctx, t, lab, hostileConfig, labrun.ClusterOptions{
			Binary: ztunnelBin, Dir: t.TempDir(), ExtraPods: extra, DaemonEnv: env, Capture: capture, NoFile: o.noFile,
		})
		if _, err := c.Mesh(ctx, "tcpapp"); err != nil {
			t.Fatal(err)
		}
		h.ca, h.pods = c.CA, c.Pods
		for name, d := range c.Daemons {
			h.daemons[name] = d
		}
	case "shared":
		c := startSharedCluster(ctx, t, lab, hostileConfig, labrun.SharedOptions{
			Binary: ztunnelBin, Dir: t.TempDir(), ExtraPods: extra, DaemonEnv: env, Capture: capture, NoFile: o.noFile,
		})
		if err := c.AddToMesh("tcpapp"); err != nil {
			t.Fatal(err)
		}
		h.ca, h.pods = c.CA, c.Pods
		for _, name := range []string{"target", "tcpapp"} {
			h.daemons[name] = c.Daemons["node-a"]
		}
		h.daemons["honest"] = c.Daemons["node-b"]
	default:
		t.Fatalf("no mode %q", mode)
	}
	for _, name := range []string{"target", "tcpapp", "attacker"} {
		if err := h.pods[name].EnableIPv6(); err != nil {
			t.Fatal(err)
		}
	}
	// The attacker's kernel answers the target's SYN-ACKs to raw flows
	// with resets (it has no socket for them): drop those.
	rule := []string{"-A", "OUTPUT", "-p", "tcp", "--sport", fmt.Sprintf("%d:%d", rawPortFirst, rawPortLast),
		"--tcp-flags", "RST", "RST", "-j", "DROP"}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if out, err := h.pods["attacker"].Command(ctx, ipt, rule...).CombinedOutput(); err != nil {
			t.Fatalf("%s in the attacker pod: %v: %s", ipt, err, out)
		}
	}
	h.rawPort.Store(rawPortFirst - 1)
	h.echo = startEcho(t, h.pods["target"], 8080)
	h.tcpEcho = startEcho(t, h.pods["tcpapp"], 8080)
	// The mesh works before anything is attacked.
	for _, dst := range []*labrun.EchoServer{h.echo, h.tcpEcho} {
		c := waitDialEcho(t, h.pods["honest"], dst.Addr, "before the attack")
		c.Close()
	}
	return h
}

// rawOutcome is what the attacker's raw connection got.
type rawOutcome struct {
	// src is the attacker's end, as the daemon logs it.
	src netip.AddrPort
	// data is every byte the connection delivered.
	data []byte
	// end is how the read ended: nil for data (the connection is then
	// reset by the attacker) or the peer's FIN, rawtcp.ErrReset,
	// rawtcp.ErrRefused (reset in answer to the SYN), or
	// context.DeadlineExceeded when nothing came within the limit.
	end error
}

// refused reports whether the connection ended (closed, reset or refused)
// without delivering a byte.
func (o rawOutcome) refused() bool {
	return len(o.data) == 0 && !errors.Is(o.end, context.DeadlineExceeded)
}

func (o rawOutcome) String() string {
	end := "FIN"
	switch {
	case len(o.data) > 0 && o.end == nil:
		end = "still open"
	case o.end != nil:
		end = o.end.Error()
	}
	return fmt.Sprintf("%d bytes %.120q, then %s", len(o.data), o.data, end)
}

// raw connects from the attacker pod to dst, written as it is into the
// packets (0.0.0.0, ::ffff:127.0.0.1: no connect() reaches them), through
// the target pod's MAC: the target's kernel takes the frame, its capture
// rules redirect the SYN to the daemon's 15006. It sends req, if any, and
// reads until the first data arrives (what the attacker was after), the
// connection ends, or limit passes.
func (h *hostileLab) raw(t *testing.T, dst netip.AddrPort, req string, limit time.Duration) rawOutcome {
	t.Helper()
	attacker, target := h.pods["attacker"], h.pods["target"]
	// The attacker learns the MAC by ARP or neighbour discovery; the test
	// takes it from the pod.
	mac, err := target.HardwareAddr("eth0")
	if err != nil {
		t.Fatal(err)
	}
	src := attacker.IP
	if !dst.Addr().Is4() {
		src = attacker.IP6
	}
	port := h.rawPort.Add(1)
	if port > rawPortLast {
		t.Fatal("out of raw source ports")
	}
	out := rawOutcome{src: netip.AddrPortFrom(src, uint16(port))}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, err := rawtcp.Dial(ctx, rawtcp.Config{
		Interface: "eth0", DstMAC: mac, Src: out.src, Dst: dst, Control: attacker.Do,
	})
	if errors.Is(err, rawtcp.ErrRefused) {
		out.end = err
		return out
	}
	if err != nil {
		t.Fatalf("raw handshake with %s: %v", dst, err)
	}
	defer c.Close()
	if req != "" {
		if err := c.Write(ctx, []byte(req)); err != nil {
			// Reset before the request was taken: refused; or no
			// acknowledgement within limit.
			out.end = err
			return out
		}
	}
	out.data, out.end = c.Read(ctx)
	if errors.Is(out.end, io.EOF) {
		out.end = nil
	}
	if c.Dropped > 0 {
		t.Logf("raw connection to %s: %d packets of the flow dropped as malformed", dst, c.Dropped)
	}
	return out
}

// waitRefusalLogged waits for the daemon's access log to report an error
// for the attacker's connection from src: a refusal names its source.
func waitRefusalLogged(t *testing.T, d *labrun.Daemon, src netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	line, err := d.WaitLog(ctx, "\taccess\t", "src.addr="+src.String()+" ", "error=")
	if err != nil {
		t.Errorf("no refusal of %s logged: %v", src, err)
		return
	}
	t.Logf("logged: %s", line)
}

// honestRoundTrip checks that the honest pod (in the mesh, on node-b)
// still gets an echo from dst through the daemons.
func (h *hostileLab) honestRoundTrip(t *testing.T, dst netip.AddrPort) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialEcho(ctx, h.pods["honest"], dst, "an honest request")
	if err != nil {
		return err
	}
	return c.Close()
}

// fdCount is the number of descriptors the daemon has open.
func fdCount(d *labrun.Daemon) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.PID()))
	return len(ents), err
}

// bannerServer listens on addr inside pod and writes banner to every
// connection it accepts, then keeps it open until the peer closes: a
// service that answers before it is asked, so that reaching it is proof
// enough.
func bannerServer(t *testing.T, pod *netnslab.Pod, network, addr, banner string) *nettest.Server {
	t.Helper()
	ln, err := pod.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	return nettest.Handle(t, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := c.Write([]byte(banner)); err == nil {
			c.Read(make([]byte, 1))
		}
	})
}

// logTail returns the last n bytes of a daemon's log, for failure
// messages.
func logTail(d *labrun.Daemon, n int) string {
	l := d.Log()
	if len(l) > n {
		l = "..." + l[len(l)-n:]
	}
	return strings.TrimSpace(l)
}
