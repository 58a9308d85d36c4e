package harness

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// target is one config: where zload runs, how it connects, what to measure.
type target struct {
	cfg   report.Config
	ns    netnslab.NS
	args  []string // zload's connection flags
	procs []*proc
}

func (b *bench) addTarget(t *target) {
	if b.o.Paths != nil && !t.cfg.Direct && !b.o.Paths.MatchString(t.cfg.ID) {
		return
	}
	for _, p := range t.procs {
		t.cfg.Procs = append(t.cfg.Procs, p.name)
	}
	b.targets = append(b.targets, t)
	b.run.Configs = append(b.run.Configs, t.cfg)
}

// certArgs are the flags that give zload (or a peer) a mesh certificate.
func (b *bench) certArgs(sa string) []string {
	return []string{"--ca-cert", b.caCert, "--ca-key", b.caKey, "--identity", spiffe(sa)}
}

// startPeer runs zpeer in pod and waits for its port.
func (b *bench) startPeer(ctx context.Context, pod *netnslab.Pod, name string, listen string, pprofN int, args ...string) (*proc, error) {
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pprofBase+pprofN)
	argv := append([]string{b.o.Zpeer}, args...)
	argv = append(argv, "--listen", listen, "--pprof", pprofAddr, "--duration", b.lifetime().String())
	c, err := startChild(ctx, pod.NS, name, nil, argv...)
	if err != nil {
		return nil, err
	}
	b.children = append(b.children, c)
	_, port, _ := strings.Cut(listen, ":")
	if err := waitListening(ctx, pod.NS, "127.0.0.1:"+port, c, 15*time.Second); err != nil {
		return nil, err
	}
	return &proc{name: name, pid: c.pid(), ns: pod.NS, pprof: "http://" + pprofAddr}, nil
}

// startServerPeer runs a server-side zpeer (h2-server, tls) in pod on
// port of every address, with the peer server's mesh certificate.
func (b *bench) startServerPeer(ctx context.Context, pod *netnslab.Pod, name string, port, pprofN int, args ...string) (*proc, error) {
	return b.startPeer(ctx, pod, name, fmt.Sprintf("0.0.0.0:%d", port), pprofN, append(args, b.certArgs(peerServerSA)...)...)
}

// haproxyMaxConn is every HAProxy's global maxconn: above the full run's
// idle ramp (defaultIdleConns, which a lower maxconn would stall), yet low
// enough that HAProxy's file limit (two fds per connection, plus a pipe
// pair for a quarter of them with splice: about 15,000) fits under the
// usual hard limit of 20000.
const haproxyMaxConn = 6000

// haproxyIdleTimeout is every HAProxy's client and server timeout: an idle
// ramp's first connections sit idle through the rest of the ramp (some 20 s
// for 5,000 TLS handshakes on a busy machine), the 30 s settle and the hold,
// and HAProxy must not close them before the last reading.
const haproxyIdleTimeout = "2m"

// haproxyConfig is a minimal TCP-mode configuration, as a user would
// write it: the default thread count, no logging.
func haproxyConfig(listen, backend string, splice bool) string {
	sp := "no option splice-auto"
	if splice {
		sp = "option splice-auto"
	}
	return fmt.Sprintf(`global
    maxconn %[1]d
defaults
    mode tcp
    timeout connect 5s
    timeout client %[2]s
    timeout server %[2]s
    %[3]s
frontend bench
    bind %[4]s
    default_backend up
backend up
    server s1 %[5]s
`, haproxyMaxConn, haproxyIdleTimeout, sp, listen, backend)
}

func (b *bench) startHAProxy(ctx context.Context, pod *netnslab.Pod, name string, port int, backend string, splice bool) (*proc, error) {
	cfg := haproxyConfig(fmt.Sprintf("127.0.0.1:%d", port), backend, splice)
	return b.runHAProxy(ctx, pod, name, fmt.Sprintf("haproxy-%d.cfg", port), cfg, port)
}

// runHAProxy writes cfg to file in the scratch directory, has HAProxy check
// it, starts HAProxy with it in pod and waits until it accepts on port of
// the pod's loopback.
func (b *bench) runHAProxy(ctx context.Context, pod *netnslab.Pod, name, file, cfg string, port int) (*proc, error) {
	cfgPath := filepath.Join(b.dir, file)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, b.o.HAProxy, "-c", "-q", "-f", cfgPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("harness: haproxy config: %v: %s", err, out)
	}
	// -db: stay in the foreground, so the pid is HAProxy's own.
	c, err := startChild(ctx, pod.NS, name, nil, b.o.HAProxy, "-db", "-f", cfgPath)
	if err != nil {
		return nil, err
	}
	b.children = append(b.children, c)
	if err := waitListening(ctx, pod.NS, fmt.Sprintf("127.0.0.1:%d", port), c, 10*time.Second); err != nil {
		return nil, err
	}
	return &proc{name: name, pid: c.pid(), ns: pod.NS}, nil
}

// daemonProc returns the daemon of a meshed pod; every path through it
// shares the one *proc, so a restart updates them all.
func (b *bench) daemonProc(pod string) (*proc, error) {
	if d, ok := b.daemons[pod]; ok {
		return d, nil
	}
	p := b.cluster.Pods[pod]
	pid, err := findPid(p.NetNS, b.o.variant(b.backendOf(pod)).Binary)
	if err != nil {
		return nil, err
	}
	d := &proc{name: "ztunnel in " + pod, pid: pid, ns: p.NS, pprof: "http://127.0.0.1:15000", daemon: true, pod: pod}
	if b.daemons == nil {
		b.daemons = map[string]*proc{}
	}
	b.daemons[pod] = d
	return d, nil
}

// backendOf returns the engine backend of a meshed pod's daemon.
func (b *bench) backendOf(pod string) string {
	for _, be := range b.o.Backends {
		if pod == meshClient(be) || pod == meshServer(be) {
			return be
		}
	}
	return b.o.Backends[0]
}

// startDaemon (re)starts the daemon of a meshed pod with its backend.
func (b *bench) startDaemon(ctx context.Context, pod string) error {
	if d := b.cluster.Daemons[pod]; d != nil {
		if err := d.Stop(); err != nil {
			b.logf("stopping the daemon in %s: %v", pod, err)
		}
	}
	v := b.o.variant(b.backendOf(pod))
	d, err := labrun.StartDaemon(ctx, b.cluster.Pods[pod], labrun.DaemonOptions{
		Binary: v.Binary, ConfigPath: b.cluster.ConfigPath, CACert: b.caCert, CAKey: b.caKey,
		Workload: namespaceName + "/" + pod + "/" + pod, Env: append([]string{EngineEnv + "=" + v.Engine}, v.Env...),
		LogLevel: b.o.DaemonLogLevel,
	})
	if err != nil {
		return err
	}
	b.cluster.Daemons[pod] = d
	if p, ok := b.daemons[pod]; ok {
		if p.pid, err = findPid(b.cluster.Pods[pod].NetNS, v.Binary); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) startPeersAndTargets(ctx context.Context) error {
	cli, srv := b.cluster.Pods[podClient], b.cluster.Pods[podServer]
	srvApp := netip.AddrPortFrom(srv.IP, appPort).String()
	addr := func(ip netip.Addr, port int) string { return netip.AddrPortFrom(ip, uint16(port)).String() }
	loop := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

	b.addTarget(&target{
		cfg: report.Config{ID: report.DirectID, Group: report.GroupTCP, Proxy: "direct (no proxy)", Direct: true,
			Note: fmt.Sprintf("%s → %s", podClient, srvApp)},
		ns: cli.NS, args: []string{"--target", srvApp},
	})

	// One TCP hop.
	for _, be := range b.o.Backends {
		d, err := b.daemonProc(meshClient(be))
		if err != nil {
			return err
		}
		b.addTarget(&target{
			cfg: report.Config{ID: report.ConfigID(report.GroupTCP, report.DaemonKey(be)), Group: report.GroupTCP,
				Proxy: fmt.Sprintf("ztunnel-go (%s) passthrough", be), Backend: be, Daemon: true,
				Note: fmt.Sprintf("%s (captured) → daemon 15001 → %s (not in the mesh: plain TCP)", meshClient(be), srvApp)},
			ns: b.cluster.Pods[meshClient(be)].NS, args: []string{"--target", srvApp}, procs: []*proc{d},
		})
	}
	cp, err := b.startPeer(ctx, cli, "zpeer copy", loop(copyPort), 1, "copy", "--to", srvApp)
	if err != nil {
		return err
	}
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupTCP, report.KeyCopy), Group: report.GroupTCP, Proxy: "Go io.Copy proxy",
			Note: fmt.Sprintf("%s → 127.0.0.1:%d (in %s) → %s", podClient, copyPort, podClient, srvApp)},
		ns: cli.NS, args: []string{"--target", loop(copyPort)}, procs: []*proc{cp},
	})
	cc := b.cluster.Pods[podCaptured]
	cpc, err := b.startPeer(ctx, cc, "zpeer copy (captured)", fmt.Sprintf("0.0.0.0:%d", netnslab.OutboundPort), 7,
		"copy", "--original-dst", "--mark", fmt.Sprint(netnslab.PacketMark))
	if err != nil {
		return err
	}
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupTCP, report.KeyCopyCaptured), Group: report.GroupTCP,
			Proxy: "Go io.Copy proxy behind the capture rules",
			Note:  fmt.Sprintf("%s (captured, no daemon) → io.Copy proxy on 15001 (SO_ORIGINAL_DST, SO_MARK) → %s: the daemon's position", podCaptured, srvApp)},
		ns: cc.NS, args: []string{"--target", srvApp}, procs: []*proc{cpc},
	})
	if !b.skipWithoutHAProxy("HAProxy (splice and no splice)") {
		for _, h := range []struct {
			key, name string
			port      int
			splice    bool
		}{
			{report.KeyHAProxySplice, "HAProxy TCP, splice-auto", haproxySplice, true},
			{report.KeyHAProxy, "HAProxy TCP, no splice", haproxyNoSplic, false},
		} {
			p, err := b.startHAProxy(ctx, cli, "haproxy ("+h.key+")", h.port, srvApp, h.splice)
			if err != nil {
				b.run.Skipped = append(b.run.Skipped, report.Skip{What: h.name, Reason: err.Error()})
				continue
			}
			b.addTarget(&target{
				cfg: report.Config{ID: report.ConfigID(report.GroupTCP, h.key), Group: report.GroupTCP, Proxy: h.name,
					Note: fmt.Sprintf("%s → 127.0.0.1:%d (in %s) → %s", podClient, h.port, podClient, srvApp)},
				ns: cli.NS, args: []string{"--target", loop(h.port)}, procs: []*proc{p},
			})
		}
	}

	// One HBONE hop: zload is the mTLS client.
	peerSAN := spiffe(peerServerSA)
	for _, be := range b.o.Backends {
		ms := b.cluster.Pods[meshServer(be)]
		d, err := b.daemonProc(meshServer(be))
		if err != nil {
			return err
		}
		app := addr(ms.IP, appPort)
		b.addTarget(&target{
			cfg: report.Config{ID: report.ConfigID(report.GroupHBONE1, report.DaemonKey(be)), Group: report.GroupHBONE1,
				Proxy: fmt.Sprintf("ztunnel-go (%s) inbound", be), Backend: be, Daemon: true,
				Note: fmt.Sprintf("zload HBONE client in %s → %s:15008 → daemon → %s", podClient, ms.IP, app)},
			ns: cli.NS,
			args: append([]string{"--hbone", "--target", addr(ms.IP, hbonePort), "--authority", app, "--san", spiffe(meshServer(be))},
				b.certArgs(zloadSA)...),
			procs: []*proc{d},
		})
	}
	h2s, err := b.startServerPeer(ctx, srv, "zpeer h2-server", h2ServerPort, 3, "h2-server")
	if err != nil {
		return err
	}
	// The two-hop pair gets its own server, so each path is measured on
	// a fresh process.
	h2s2, err := b.startServerPeer(ctx, srv, "zpeer h2-server", h2ServerPort2, 8, "h2-server")
	if err != nil {
		return err
	}
	// peer adds a one-hop path through the server-side peer p, with zload
	// as its mTLS client.
	peer := func(key, proxy, note string, p *proc, args ...string) {
		b.addTarget(&target{
			cfg:   report.Config{ID: report.ConfigID(report.GroupHBONE1, key), Group: report.GroupHBONE1, Proxy: proxy, Note: note},
			ns:    cli.NS,
			args:  append(append(args, "--san", peerSAN), b.certArgs(zloadSA)...),
			procs: []*proc{p},
		})
	}
	peer(report.KeyH2, "naive Go HBONE server (x/net/http2)",
		fmt.Sprintf("zload HBONE client in %s → %s (x/net/http2 Server over crypto/tls) → %s", podClient, addr(srv.IP, h2ServerPort), srvApp),
		h2s, "--hbone", "--target", addr(srv.IP, h2ServerPort), "--authority", srvApp)
	tl, err := b.startServerPeer(ctx, srv, "zpeer tls", tlsPort, 2, "tls", "--to", loop(appPort))
	if err != nil {
		return err
	}
	peer(report.KeyTLS, "raw Go TLS 1.3 terminator",
		fmt.Sprintf("zload mTLS client in %s → %s (crypto/tls + io.Copy) → 127.0.0.1:%d", podClient, addr(srv.IP, tlsPort), appPort),
		tl, "--tls", "--target", addr(srv.IP, tlsPort))
	if err := b.addHAProxyTLSTargets(ctx, false); err != nil {
		return err
	}
	if err := b.addHAProxyCapturedTerminator(ctx); err != nil {
		return err
	}

	// Two hops.
	for _, be := range b.o.Backends {
		mc, ms := b.cluster.Pods[meshClient(be)], b.cluster.Pods[meshServer(be)]
		d1, err := b.daemonProc(meshClient(be))
		if err != nil {
			return err
		}
		d2, err := b.daemonProc(meshServer(be))
		if err != nil {
			return err
		}
		b.addTarget(&target{
			cfg: report.Config{ID: report.ConfigID(report.GroupHBONE2, report.DaemonKey(be)), Group: report.GroupHBONE2,
				Proxy: fmt.Sprintf("ztunnel-go (%s) pair, HBONE", be), Backend: be, Daemon: true,
				Note: fmt.Sprintf("%s (captured) → daemon → HBONE → daemon → %s", meshClient(be), addr(ms.IP, appPort))},
			ns: mc.NS, args: []string{"--target", addr(ms.IP, appPort)}, procs: []*proc{d1, d2},
		})
	}
	h2c, err := b.startPeer(ctx, cli, "zpeer h2-client", loop(h2ClientPort), 4,
		append([]string{"h2-client", "--to", addr(srv.IP, h2ServerPort2), "--authority", srvApp, "--san", peerSAN},
			b.certArgs(peerClientSA)...)...)
	if err != nil {
		return err
	}
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupHBONE2, report.KeyH2), Group: report.GroupHBONE2,
			Proxy: "naive Go HBONE pair (x/net/http2)",
			Note:  fmt.Sprintf("%s → 127.0.0.1:%d (x/net/http2 Transport) → mTLS → %s (Server) → %s", podClient, h2ClientPort, addr(srv.IP, h2ServerPort2), srvApp)},
		ns: cli.NS, args: []string{"--target", loop(h2ClientPort)}, procs: []*proc{h2c, h2s2},
	})
	if err := b.addHAProxyTLSTargets(ctx, true); err != nil {
		return err
	}
	if err := b.addHAProxyCapturedPair(ctx); err != nil {
		return err
	}
	hop2, err := b.startPeer(ctx, srv, "zpeer copy (hop 2)", fmt.Sprintf("0.0.0.0:%d", copyHop2Port), 6, "copy", "--to", loop(appPort))
	if err != nil {
		return err
	}
	hop1, err := b.startPeer(ctx, cli, "zpeer copy (hop 1)", loop(copyHop1Port), 5, "copy", "--to", addr(srv.IP, copyHop2Port))
	if err != nil {
		return err
	}
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupHBONE2, report.KeyCopyPair), Group: report.GroupHBONE2,
			Proxy: "two Go io.Copy hops (plain, no tunnel)",
			Note:  fmt.Sprintf("%s → 127.0.0.1:%d → %s → 127.0.0.1:%d", podClient, copyHop1Port, addr(srv.IP, copyHop2Port), appPort)},
		ns: cli.NS, args: []string{"--target", loop(copyHop1Port)}, procs: []*proc{hop1, hop2},
	})
	b.logf("%d paths ready", len(b.targets))
	return nil
}
