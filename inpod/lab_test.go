package inpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// labMesh: client and late on node-a, server on node-b, all HBONE; server
// refuses anyone without an mTLS identity (PeerAuthentication STRICT), so a
// connection reaches it only through the tunnel.
const labMesh = `
workloads:
- uid: uid-client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: uid-late
  name: late
  namespace: default
  serviceAccount: late
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: uid-server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  services: {}
  authorizationPolicies: ["default/strict"]
policies:
- name: strict
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - notPrincipals:
        - Presence: []
`

// labDaemon is what one node's daemon holds, run in-process: a Manager
// connected to the node's fake CNI agent, and real proxies.
type labDaemon struct {
	mgr   *Manager
	ready *readiness
	pool  *hbone.Pool
	m     *metrics.Metrics
}

type labWorld struct {
	t      testing.TB
	lab    *netnslab.Lab
	store  *state.Store
	certs  *mtls.Store
	dir    string
	log    *slog.Logger
	agents map[string]*zdstest.Server // by node
	pods   map[string]*netnslab.Pod
	// engine relays for every pod's proxy, as the daemon's one engine
	// does; closed after the managers (cleanups run last-in first-out).
	engine *engine.Engine
}

func newLabWorld(t *testing.T) *labWorld {
	t.Helper()
	return newWorld(t, netnslab.New(t), labMesh)
}

// newWorld is a lab with the mesh config, before any daemon.
func newWorld(t testing.TB, lab *netnslab.Lab, config string) *labWorld {
	t.Helper()
	snap, err := xdsconv.LocalSnapshot([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := caclient.NewBuiltinCA("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	w := &labWorld{
		t: t, lab: lab, store: state.NewStore(snap), dir: t.TempDir(),
		certs:  mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca, Impersonate: true})}),
		agents: map[string]*zdstest.Server{}, pods: map[string]*netnslab.Pod{},
		log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	t.Cleanup(w.certs.Close)
	if w.engine, err = engine.New(engine.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.engine.Close() })
	return w
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("%s", b)
	}
	return len(b), nil
}

// newProxy is what the daemon's shared mode does for a pod: a real proxy
// whose every socket is made inside the pod's netns, marked 1337.
func (w *labWorld) newProxy(pool *hbone.Pool, m *metrics.Metrics) func(Pod) (Proxy, error) {
	return func(pod Pod) (Proxy, error) {
		return proxy.New(proxy.Config{
			Workload: proxy.WorkloadRef{Namespace: pod.Namespace, Name: pod.Name, ServiceAccount: pod.ServiceAccount},
			State:    w.store, Certs: w.certs, Pool: pool, Metrics: m, Engine: w.engine,
			Socket:    engine.SocketOptions{Mark: 1337},
			ReusePort: true,
			Control:   pod.Netns.Run,
			Logger:    w.log.With("pod", pod.Name),
		})
	}
}

// agent returns node's fake CNI agent, starting it on first use.
func (w *labWorld) agent(node string) *zdstest.Server {
	w.t.Helper()
	if a := w.agents[node]; a != nil {
		return a
	}
	a, err := zdstest.Start(zdstest.Config{Path: filepath.Join(w.dir, node+".sock")})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { a.Close() })
	w.agents[node] = a
	return a
}

// startDaemon starts a daemon (manager) for node against its agent.
func (w *labWorld) startDaemon(node string, migrate bool) *labDaemon {
	w.t.Helper()
	d := &labDaemon{pool: hbone.NewPool(hbone.PoolConfig{}), m: metrics.New(metrics.Config{}), ready: &readiness{}}
	mgr, err := New(Config{
		UDS: w.agent(node).Path(), NewProxy: w.newProxy(d.pool, d.m), Ready: d.ready.register, Metrics: d.m,
		Logger: w.log.With("node", node), MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		MigrateRequests: migrate,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	d.mgr = mgr
	mgr.Start()
	w.t.Cleanup(d.stop)
	return d
}

// drain stops the daemon gracefully, letting connections finish for grace.
func (d *labDaemon) drain(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	d.mgr.Drain(ctx)
	d.pool.Close()
}

func (d *labDaemon) stop() { d.drain(0) }

// addPod builds the pod, installs the CNI's in-pod rules and hands its netns
// to its node's daemon, as istio-cni does.
func (w *labWorld) addPod(node *netnslab.Node, name string) (*netnslab.Pod, string) {
	w.t.Helper()
	p, err := node.AddPod(name)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := p.InstallCapture(); err != nil {
		w.t.Fatal(err)
	}
	w.pods[name] = p
	ack, err := w.agent(node.Name).Add(zdstest.Pod{
		UID: "uid-" + name, Name: name, Namespace: "default", ServiceAccount: name, NetnsPath: p.Path(),
	})
	if err != nil && !errors.Is(err, zdstest.ErrNotConnected) {
		w.t.Fatal(err)
	}
	if ack != "" {
		w.t.Fatalf("add %s: Nack %q", name, ack)
	}
	return p, ack
}

func waitReady(t *testing.T, d *labDaemon) {
	t.Helper()
	eventually(t, "daemon ready", d.ready.ready)
}

// echo serves an echo app (labrun's, nettest's echo) in pod on port until
// the test ends.
func echo(t *testing.T, pod *netnslab.Pod, port uint16) {
	t.Helper()
	s, err := labrun.StartEcho(pod, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
}

func dialEcho(ctx context.Context, from *netnslab.Pod, to netip.AddrPort) (net.Conn, error) {
	c, err := from.Dial(ctx, "tcp", to.String())
	if err != nil {
		return nil, err
	}
	if err := nettest.RoundTrip(c, "hello "+from.Name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// TestSharedModeLab runs two nodes with one in-process manager each, real
// proxies in the pods' namespaces, and a fake CNI agent per node: HBONE
// between nodes, a pod added while traffic flows, a pod deleted (listeners
// gone, connections closed), an agent restart and a daemon restart.
func TestSharedModeLab(t *testing.T) {
	w := newLabWorld(t)
	nodeA, err := w.lab.AddNode("node-a")
	if err != nil {
		t.Fatal(err)
	}
	nodeB, err := w.lab.AddNode("node-b")
	if err != nil {
		t.Fatal(err)
	}
	dA, dB := w.startDaemon("node-a", false), w.startDaemon("node-b", false)
	agentA, agentB := w.agent("node-a"), w.agent("node-b")
	client, _ := w.addPod(nodeA, "client")
	server, _ := w.addPod(nodeB, "server")
	waitReady(t, dA)
	waitReady(t, dB)
	// Readiness waited for the first snapshot; the Adds above may have come
	// before or after it, so wait for both proxies.
	eventually(t, "both proxies up", func() bool {
		return dA.mgr.WorkloadState()["uid-client"].State == StateUp && dB.mgr.WorkloadState()["uid-server"].State == StateUp
	})
	echo(t, server, 8080)
	srvAddr := netip.AddrPortFrom(server.IP, 8080)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// HBONE between nodes; the server refuses anything without identity.
	long, err := dialEcho(ctx, client, srvAddr)
	if err != nil {
		t.Fatalf("client -> server through HBONE: %v", err)
	}
	defer long.Close()
	if c, err := nodeA.Dial(ctx, "tcp", srvAddr.String()); err == nil {
		if nettest.RoundTrip(c, "plain") == nil {
			t.Fatal("a plaintext connection from outside the mesh reached the STRICT server")
		}
		c.Close()
	}

	// Traffic flows while a pod is added.
	var okConns, badConns atomic.Int64
	stopLoad := make(chan struct{})
	var loadWG sync.WaitGroup
	loadWG.Go(func() {
		for {
			select {
			case <-stopLoad:
				return
			default:
			}
			c, err := dialEcho(ctx, client, srvAddr)
			if err != nil {
				badConns.Add(1)
				t.Logf("load connection: %v", err)
				continue
			}
			c.Close()
			okConns.Add(1)
		}
	})
	lateNode := nodeA
	late, err := lateNode.AddPod("late")
	if err != nil {
		t.Fatal(err)
	}
	if err := late.InstallCapture(); err != nil {
		t.Fatal(err)
	}
	// Captured but not yet handed to the daemon: nothing listens on 15001.
	if c, err := late.Dial(ctx, "tcp", srvAddr.String()); err == nil {
		c.Close()
		t.Fatal("late pod connected before its proxy existed: not captured?")
	}
	if ack, err := agentA.Add(zdstest.Pod{UID: "uid-late", Name: "late", Namespace: "default", ServiceAccount: "late", NetnsPath: late.Path()}); err != nil || ack != "" {
		t.Fatalf("add late: %q %v", ack, err)
	}
	lateConn, err := dialEcho(ctx, late, srvAddr)
	if err != nil {
		t.Fatalf("late -> server after Add: %v", err)
	}
	close(stopLoad)
	loadWG.Wait()
	if badConns.Load() != 0 || okConns.Load() == 0 {
		t.Fatalf("load while adding a pod: %d ok, %d failed", okConns.Load(), badConns.Load())
	}
	t.Logf("load while adding a pod: %d connections, none failed", okConns.Load())

	// Del: the pod's connections close and its listeners are gone.
	if ack, err := agentA.Del("uid-late"); err != nil || ack != "" {
		t.Fatalf("del late: %q %v", ack, err)
	}
	lateConn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := lateConn.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the deleted pod's connection stayed open")
	}
	lateConn.Close()
	for _, port := range []int{proxy.OutboundPort, proxy.InboundPlainPort, proxy.InboundHBONEPort} {
		eventually(t, fmt.Sprintf("late's listener %d gone", port), func() bool {
			c, err := late.Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				c.Close()
				return false
			}
			return errors.Is(err, syscall.ECONNREFUSED)
		})
	}

	// The agent restarts: the manager reconnects, takes the replay (same
	// netns: no-op) and the long-lived connection survives.
	agentA.CloseConns()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := agentA.WaitSnapshots(wctx, 2); err != nil {
		t.Fatal(err)
	}
	waitReady(t, dA)
	if err := nettest.RoundTrip(long, "still here after the agent restarted"); err != nil {
		t.Fatalf("long-lived connection across the agent restart: %v", err)
	}

	// The daemon restarts: a new manager gets the snapshot and serves.
	dB.drain(500 * time.Millisecond)
	long.SetReadDeadline(time.Now().Add(nettest.RoundTripTimeout))
	if _, err := long.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection through the stopped daemon still open")
	}
	dB = w.startDaemon("node-b", false)
	if err := agentB.WaitSnapshots(wctx, 2); err != nil {
		t.Fatal(err)
	}
	waitReady(t, dB)
	c, err := dialEcho(ctx, client, srvAddr)
	if err != nil {
		t.Fatalf("client -> server after the daemon restart: %v", err)
	}
	c.Close()
	if n := len(agentA.Nacks()) + len(agentB.Nacks()); n != 0 {
		t.Fatalf("%d Nacks: %v %v", n, agentA.Nacks(), agentB.Nacks())
	}
}

// loadGen opens connections from one pod to an echo server as fast as it
// can with several workers, each connection one round trip, and counts
// them.
type loadGen struct {
	ok, failed atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	errs       []string
}

func startLoad(ctx context.Context, from *netnslab.Pod, to netip.AddrPort, workers int) *loadGen {
	g := &loadGen{stop: make(chan struct{})}
	for range workers {
		g.wg.Go(func() {
			for {
				select {
				case <-g.stop:
					return
				default:
				}
				c, err := dialEcho(ctx, from, to)
				if err != nil {
					g.failed.Add(1)
					g.mu.Lock()
					if len(g.errs) < 5 {
						g.errs = append(g.errs, err.Error())
					}
					g.mu.Unlock()
					continue
				}
				c.Close()
				g.ok.Add(1)
			}
		})
	}
	return g
}

func (g *loadGen) finish() (ok, failed int64, errs []string) {
	close(g.stop)
	g.wg.Wait()
	return g.ok.Load(), g.failed.Load(), g.errs
}

// upgrade starts a second daemon for node next to old, waits until it
// serves every pod, then drains old: both daemons' listeners share the
// pods' ports through SO_REUSEPORT during the switch.
func (w *labWorld) upgrade(t *testing.T, node string, old *labDaemon, migrate bool, uids ...string) *labDaemon {
	t.Helper()
	a := w.agent(node)
	before := a.Connections()
	d := w.startDaemon(node, migrate)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitSnapshots(ctx, before+1); err != nil {
		t.Fatal(err)
	}
	waitReady(t, d)
	for _, uid := range uids {
		eventually(t, "new daemon serves "+uid, func() bool { return d.mgr.WorkloadState()[uid].State == StateUp })
	}
	time.Sleep(200 * time.Millisecond) // both daemons take connections for a while
	old.drain(2 * time.Second)
	time.Sleep(200 * time.Millisecond) // and the new one alone
	return d
}

// TestSharedModeUpgrade counts the connection attempts lost while a second
// daemon takes over a node from the first (SO_REUSEPORT on every pod
// listener), client side first and then server side, under a load of
// back-to-back new connections; with and without tcp_migrate_req.
func TestSharedModeUpgrade(t *testing.T) {
	for _, migrate := range []bool{true, false} {
		t.Run(fmt.Sprintf("migrate=%v", migrate), func(t *testing.T) {
			w := newLabWorld(t)
			nodeA, err := w.lab.AddNode("node-a")
			if err != nil {
				t.Fatal(err)
			}
			nodeB, err := w.lab.AddNode("node-b")
			if err != nil {
				t.Fatal(err)
			}
			client, _ := w.addPod(nodeA, "client")
			server, _ := w.addPod(nodeB, "server")
			dA, dB := w.startDaemon("node-a", migrate), w.startDaemon("node-b", migrate)
			waitReady(t, dA)
			waitReady(t, dB)
			echo(t, server, 8080)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srvAddr := netip.AddrPortFrom(server.IP, 8080)
			if c, err := dialEcho(ctx, client, srvAddr); err != nil {
				t.Fatal(err)
			} else {
				c.Close()
			}
			g := startLoad(ctx, client, srvAddr, 8)
			w.upgrade(t, "node-a", dA, migrate, "uid-client")
			w.upgrade(t, "node-b", dB, migrate, "uid-server")
			ok, failed, errs := g.finish()
			t.Logf("upgrade of both nodes under load (tcp_migrate_req=%v): %d connection attempts, %d failed %q", migrate, ok+failed, failed, errs)
			if ok == 0 {
				t.Fatal("no connection succeeded")
			}
			if migrate && failed != 0 {
				t.Fatalf("%d of %d new connections lost during the upgrade", failed, ok+failed)
			}
		})
	}
}
