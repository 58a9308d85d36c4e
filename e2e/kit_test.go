package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/caclient/catest"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// startSharedCluster starts a shared-mode cluster in lab for t (see
// labrun.StartSharedCluster). It is stopped when the test ends, and every
// daemon's log is printed if the test failed.
func startSharedCluster(ctx context.Context, t *testing.T, lab *netnslab.Lab, config string, o labrun.SharedOptions) *labrun.SharedCluster {
	t.Helper()
	c, err := labrun.StartSharedCluster(ctx, lab, []byte(config), o)
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, c.Close, c.AllDaemons)
	return c
}

// stopAtEnd stops a cluster with stop when the test ends and, if the test
// failed, prints the log of every daemon it ran.
func stopAtEnd(t *testing.T, stop func() error, daemons func() []*labrun.Daemon) {
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stopping daemons: %v", err)
		}
		if t.Failed() {
			for _, d := range daemons() {
				t.Logf("daemon %s log:\n%s", d.Pod.Name, d.Log())
			}
		}
	})
}

// startEcho starts an echo server on port in pod, closed when the test ends.
func startEcho(t *testing.T, pod *netnslab.Pod, port uint16) *labrun.EchoServer {
	t.Helper()
	s, err := labrun.StartEcho(pod, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// dialEcho connects pod to addr and checks one round trip.
func dialEcho(ctx context.Context, pod *netnslab.Pod, addr netip.AddrPort, msg string) (net.Conn, error) {
	c, err := pod.Dial(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	if err := nettest.RoundTrip(c, msg); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitDialEcho retries dialEcho until it works, failing after a generous
// limit (a daemon recovering may refuse a few first).
func waitDialEcho(t *testing.T, pod *netnslab.Pod, addr netip.AddrPort, msg string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err = dialEcho(ctx, pod, addr, msg)
		return err == nil
	}) {
		t.Fatalf("%s -> %s never recovered: %v", pod.Name, addr, err)
	}
	return c
}

// startCluster starts a dedicated-mode cluster in lab for t (see
// labrun.StartCluster). It is stopped when the test ends, and every
// daemon's log is printed if the test failed.
func startCluster(ctx context.Context, t *testing.T, lab *netnslab.Lab, config string, o labrun.ClusterOptions) *labrun.Cluster {
	t.Helper()
	c, err := labrun.StartCluster(ctx, lab, []byte(config), o)
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, c.Close, func() []*labrun.Daemon { return slices.Collect(maps.Values(c.Daemons)) })
	return c
}

// controlPlane is istiod inside the lab's "cp" node: the xDS server on
// :15012 and the Istio CA on :15013, both with certificates for istiod's
// in-cluster name and the node's address.
type controlPlane struct {
	node *netnslab.Node
	xds  *xdstest.Server
	ca   *catest.Server
	// xdsAddr is the xDS listener's host:port inside cp.
	xdsAddr string
}

func startControlPlane(t *testing.T, lab *netnslab.Lab) *controlPlane {
	t.Helper()
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"istiod.istio-system.svc", cp.IP.String()}
	xdsAddr := cp.IP.String() + ":15012"
	xdsLn, err := cp.Listen("tcp", xdsAddr)
	if err != nil {
		t.Fatal(err)
	}
	caLn, err := cp.Listen("tcp", cp.IP.String()+":15013")
	if err != nil {
		t.Fatal(err)
	}
	return &controlPlane{
		node: cp, xdsAddr: xdsAddr,
		xds: xdstest.NewServer(t, xdstest.Options{Listener: xdsLn, ServerNames: names}),
		ca:  catest.NewServer(t, catest.Options{Listener: caLn, ServerNames: names}),
	}
}

// env moves a daemon off the local config file and the built-in CA onto
// this control plane.
func (cp *controlPlane) env() []string {
	return []string{
		"LOCAL_XDS_PATH=", "BUILTIN_CA_CERT=", "BUILTIN_CA_KEY=", "FAKE_CA=false",
		"XDS_ADDRESS=" + cp.xds.Address(), "XDS_ROOT_CA=" + cp.xds.TLS().RootFile,
		"CA_ADDRESS=" + cp.ca.Address(), "CA_ROOT_CA=" + cp.ca.TLS().RootFile,
	}
}

// servePod runs handle for every connection to port on all of pod's
// addresses until the test ends (see nettest.Handle); the server's Addr is
// the pod's address.
func servePod(t *testing.T, pod *netnslab.Pod, port uint16, handle func(net.Conn)) *nettest.Server {
	t.Helper()
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	s := nettest.Handle(t, ln, handle)
	s.Addr = netip.AddrPortFrom(pod.IP, port)
	return s
}

// hboneTunnel opens an HBONE tunnel from inside pod from (not through a
// daemon) to dst's 15008 with the TLS configuration cfg and CONNECTs to
// authority. A failed dial fails the test; a refused handshake or CONNECT
// is returned. The tunnel is closed when the test ends.
func hboneTunnel(ctx context.Context, t *testing.T, from *netnslab.Pod, cfg *tls.Config, dst netip.Addr, authority string) (*hbone.Stream, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := from.Dial(ctx, "tcp", netip.AddrPortFrom(dst, 15008).String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{})
	if err != nil {
		raw.Close()
		return nil, err
	}
	t.Cleanup(func() { cc.Close() })
	return cc.Connect(ctx, &hbone.Request{Authority: authority})
}

// eventually calls cond every interval until it holds or limit has passed
// (with one last try then), and reports whether it held. It bounds a wait
// on real daemons, whose timers run in other processes: synctest cannot
// make those exact.
func eventually(limit, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}
