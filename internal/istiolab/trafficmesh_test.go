//go:build istiolab

package istiolab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// trafficMesh is the lab the restart and rotation tests share: two nodes with istio-cni and the
// daemon, a namespace in the mesh, a server (echo on 8080) on node1, a
// client beside it and one on node2, each client's first call seen through
// HBONE by the server's daemon.
type trafficMesh struct {
	cp       *ControlPlane
	lab      *netnslab.Lab
	bin      string
	cnis     []*CNI
	ztunnels []*Ztunnel
	server   *netnslab.Pod
	clients  []*netnslab.Pod // client-near (node1), client-far (node2)
	dst      netip.AddrPort
}

// startTrafficMesh brings the mesh up; zEnv goes to every daemon, over the chart's.
func startTrafficMesh(t *testing.T, zEnv ...string) *trafficMesh {
	t.Helper()
	cp, lab := startControlPlane(t)
	return startTrafficMeshOn(t, cp, lab, zEnv...)
}

// startTrafficMeshOn brings the mesh up on a control plane the test set up
// first (a plugged-in CA, say).
func startTrafficMeshOn(t *testing.T, cp *ControlPlane, lab *netnslab.Lab, zEnv ...string) *trafficMesh {
	t.Helper()
	ctx := t.Context()
	m := &trafficMesh{cp: cp, lab: lab, bin: ztunnelBinary(t)}
	for i := range 2 {
		name := fmt.Sprintf("node%d", i+1)
		node, err := lab.AddNode(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.RegisterNode(ctx, node); err != nil {
			t.Fatal(err)
		}
		cni, err := cp.StartCNI(ctx, CNIOptions{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := cni.Stop(); err != nil {
				t.Error(err)
			}
		})
		m.cnis = append(m.cnis, cni)
		m.ztunnels = append(m.ztunnels, m.startZtunnel(t, node, "ztunnel-"+name, zEnv))
	}
	if _, err := cp.Kubectl(ctx, demoNamespaceYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	var err error
	m.server, _, err = m.cnis[0].RunPod(ctx, PodSpec{Namespace: "demo", Name: "server", ServiceAccount: "server",
		Labels: map[string]string{"app": "server"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"client-near", "client-far"} {
		c, _, err := m.cnis[i].RunPod(ctx, PodSpec{Namespace: "demo", Name: name, ServiceAccount: "client",
			Labels: map[string]string{"app": "client"}})
		if err != nil {
			t.Fatal(err)
		}
		m.clients = append(m.clients, c)
	}
	startEcho(t, m.server, 8080)
	m.dst = netip.AddrPortFrom(m.server.IP, 8080)
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	return m
}

// startZtunnel starts a daemon named name on node, taking its pods from
// the node's istio-cni; it is stopped when the test ends.
func (m *trafficMesh) startZtunnel(t *testing.T, node *netnslab.Node, name string, env []string) *Ztunnel {
	t.Helper()
	var cni *CNI
	for _, c := range m.cnis {
		if c.Node == node {
			cni = c
		}
	}
	zpod, err := node.AddPod(name)
	if err != nil {
		t.Fatal(err)
	}
	z, err := m.cp.StartZtunnel(t.Context(), ZtunnelOptions{Binary: m.bin, Pod: zpod, InpodUDS: cni.ZDSPath, Name: name, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := z.Stop(); err != nil {
			t.Error(err)
		}
	})
	return z
}

// xdsConnections counts the delta xDS streams istiod's log shows z opening
// (istiod names a connection by its proxy's ID, pod.namespace, and a
// counter).
func (m *trafficMesh) xdsConnections(z *Ztunnel) int {
	log, _ := os.ReadFile(m.cp.LogPath("istiod"))
	return logLinesWith(string(log), "ADS: new delta connection for node:"+z.Name+"."+IstioNamespace+"-")
}

// waitHBONE waits until a call from c reaches the server and server (the
// server's node's daemon) logs it inbound over HBONE with both identities.
func (m *trafficMesh) waitHBONE(t *testing.T, server *Ztunnel, c *netnslab.Pod) {
	t.Helper()
	parts := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
		`src.identity="spiffe://cluster.local/ns/demo/sa/client"`, `dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
	waitUntil(t, 2*time.Minute, func() error {
		before := logLinesWith(server.Log(), parts...)
		if err := call(t.Context(), c, m.dst); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		if nettest.Until(5*time.Second, func() bool { return logLinesWith(server.Log(), parts...) > before }) {
			return nil
		}
		return fmt.Errorf("%s: the call succeeded, but %s logged no inbound HBONE connection from it", c.Name, server.Name)
	})
}

// waitPassthrough waits until a call from c, a pod outside the mesh,
// reaches the server and server (the server's node's daemon) logs it
// inbound in plaintext: no peer identity, the address dialled.
func (m *trafficMesh) waitPassthrough(t *testing.T, server *Ztunnel, c *netnslab.Pod) {
	t.Helper()
	parts := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":", "dst.addr=" + m.dst.String() + " "}
	waitUntil(t, 2*time.Minute, func() error {
		before := logLinesWith(server.Log(), parts...)
		if err := call(t.Context(), c, m.dst); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		if nettest.Until(5*time.Second, func() bool { return logLinesWith(server.Log(), parts...) > before }) {
			if line := lastLineWith(server.Log(), "src.addr="+c.IP.String()+":"); strings.Contains(line, "src.identity=") {
				return fmt.Errorf("%s is outside the mesh, but %s logged its call with a peer identity: %s", c.Name, server.Name, line)
			}
			return nil
		}
		return fmt.Errorf("%s: the call succeeded, but %s logged no inbound plaintext connection from it", c.Name, server.Name)
	})
}

// callLoop makes calls from each client to dst back to back (a pause of
// callPause between two) until finish, counting successes and failures.
type callLoop struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex // guards the following fields
	ok     int
	failed int
	errs   []string // the first few failures, with when they happened
}

const callPause = 50 * time.Millisecond

func startCallLoop(ctx context.Context, clients []*netnslab.Pod, dst netip.AddrPort) *callLoop {
	l := &callLoop{stop: make(chan struct{})}
	for _, c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				err := call(ctx, c, dst)
				l.mu.Lock()
				if err == nil {
					l.ok++
				} else {
					l.failed++
					if len(l.errs) < 10 {
						l.errs = append(l.errs, fmt.Sprintf("%s %s: %v", time.Now().UTC().Format("15:04:05.000"), c.Name, err))
					}
				}
				l.mu.Unlock()
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(callPause):
				}
			}
		}()
	}
	return l
}

// counts returns the calls made so far.
func (l *callLoop) counts() (ok, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed
}

// finish stops the load and returns its counts and first failures.
func (l *callLoop) finish() (ok, failed int, errs []string) {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed, l.errs
}

// longConn is a connection held open from a client to the echo server.
type longConn struct {
	from string
	conn net.Conn
}

// openLong opens a connection from c to dst and checks one round trip.
func openLong(t *testing.T, c *netnslab.Pod, dst netip.AddrPort) *longConn {
	t.Helper()
	conn, err := c.Dial(t.Context(), "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	l := &longConn{from: c.Name, conn: conn}
	if err := l.roundTrip(); err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	return l
}

// roundTrip sends a line and reads it back.
func (l *longConn) roundTrip() error {
	_ = l.conn.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("still there?\n")
	if _, err := l.conn.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(l.conn, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// firstLineWith returns the number of the first line of log holding part, or
// -1.
func firstLineWith(log, part string) int {
	i := 0
	for line := range strings.Lines(log) {
		if strings.Contains(line, part) {
			return i
		}
		i++
	}
	return -1
}

// lastLineWith returns the last line of log holding part.
func lastLineWith(log, part string) string {
	var last string
	for line := range strings.Lines(log) {
		if strings.Contains(line, part) {
			last = strings.TrimSpace(line)
		}
	}
	return last
}
