package harness

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// The HAProxy mTLS pair of addHAProxyTLSTargets is an explicit proxy: its
// client dials HAProxy on the client pod's loopback and its server half
// dials the app on the server pod's loopback, in pods without capture
// rules, so neither endpoint crosses netfilter. The daemons' endpoints sit
// behind istio-cni's rules: the client's connection is redirected by NAT
// to port 15001 (conntrack on every packet, a rewrite of each), and the
// server app talks to a connection from the client's own address, routed
// back to the daemon's transparent socket by connmark and a policy route.
// Issue 36 found the two clients' verdicts diverge on that difference, so
// the run also measures the like-for-like peer: the same HAProxy pair in
// the daemons' places, behind the same rules.
//
// Client half, in podPairClient: binds 15001, where the capture rules
// redirect the pod's outbound TCP, reads the original destination
// (HAProxy asks SO_ORIGINAL_DST) and sends it, with the client's address,
// as a PROXY v2 header ahead of the mTLS handshake to the server pod's
// 15008 (the daemon's HBONE port, which the inbound rules leave alone),
// one TLS connection per connection.
//
// Server half, in podPairServer: binds 15008 with accept-proxy, and
// connects to the destination the header named from the client's address
// (usesrc clientip, IP_TRANSPARENT), as the daemon does.
//
// The daemons mark their own sockets (SO_MARK 0x539) so that the rules let
// their connections through; HAProxy 2.6 can mark only its client-side
// connections, so two rules stand in for the socket mark: in the client
// pod, a NAT exemption for the tunnel's destination (consulted on a
// connection's first packet only, as the NAT table is), and in the server
// pod a mangle rule marking what goes out lo to the apps' ports.

// capturedPairPorts are the server pod's app ports the server half may
// connect to (the zload server, and iperf3's for zbench --clients).
var capturedPairPorts = []int{appPort, iperfPort}

// capturedPairRules are the iptables commands (arguments after
// "iptables") that stand in for the daemons' socket mark in the two pods.
func capturedPairRules(server netip.Addr) (client, srv [][]string) {
	mark := fmt.Sprintf("0x%x/0x%x", netnslab.PacketMark, netnslab.MarkMask)
	ports := ""
	for i, p := range capturedPairPorts {
		if i > 0 {
			ports += ","
		}
		ports += fmt.Sprint(p)
	}
	client = [][]string{{"-t", "nat", "-I", "ISTIO_OUTPUT", "1", "-d", server.String() + "/32", "-p", "tcp",
		"--dport", fmt.Sprint(netnslab.InboundHBONEPort), "-j", "ACCEPT"}}
	srv = [][]string{{"-t", "mangle", "-I", "OUTPUT", "1", "-o", "lo", "-p", "tcp", "-m", "multiport",
		"--dports", ports, "-j", "MARK", "--set-xmark", mark}}
	return client, srv
}

// startCapturedPair installs the rules that stand in for the daemons'
// socket mark in the captured pods hc and hs and starts the pair's halves
// there: the client half (first) on hc's 15001, the server half on hs's
// 15008.
func (b *bench) startCapturedPair(ctx context.Context, hc, hs *netnslab.Pod) (client, server *proc, err error) {
	cliRules, srvRules := capturedPairRules(hs.IP)
	if err := iptables(ctx, hc, cliRules); err != nil {
		return nil, nil, err
	}
	if err := iptables(ctx, hs, srvRules); err != nil {
		return nil, nil, err
	}
	srvCrt, err := b.writeHAProxyCert(ctx, peerServerSA)
	if err != nil {
		return nil, nil, err
	}
	cliCrt, err := b.writeHAProxyCert(ctx, peerClientSA)
	if err != nil {
		return nil, nil, err
	}
	// "server s1 0.0.0.0" without a port: the destination the PROXY
	// header gave, address and port.
	srvCfg := haproxyTLSConfig(haproxyTerminate, fmt.Sprintf("0.0.0.0:%d", netnslab.InboundHBONEPort), "0.0.0.0",
		srvCrt, b.caCert, "accept-proxy", "source 0.0.0.0 usesrc clientip")
	server, err = b.runHAProxy(ctx, hs, "haproxy (captured mTLS pair, server half)", "haproxy-captured-srv.cfg", srvCfg, netnslab.InboundHBONEPort)
	if err != nil {
		return nil, nil, err
	}
	hbone := netip.AddrPortFrom(hs.IP, netnslab.InboundHBONEPort)
	cliCfg := haproxyTLSConfig(haproxyOriginate, fmt.Sprintf("0.0.0.0:%d", netnslab.OutboundPort), hbone.String(),
		cliCrt, b.caCert, "", "send-proxy-v2")
	client, err = b.runHAProxy(ctx, hc, "haproxy (captured mTLS pair, client half)", "haproxy-captured-cli.cfg", cliCfg, netnslab.OutboundPort)
	if err != nil {
		return nil, nil, err
	}
	return client, server, nil
}

// iptables runs each rule's iptables command in pod.
func iptables(ctx context.Context, pod *netnslab.Pod, rules [][]string) error {
	for _, args := range rules {
		if out, err := pod.Command(ctx, "iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("harness: iptables %v in %s: %v: %s", args, pod.Name, err, out)
		}
	}
	return nil
}

// startCapturedTerminator starts the HAProxy mTLS terminator in the
// daemon's place of one hop: on the captured pod ts's 15008, connecting to
// ts's app from the client's address, with the server pod's rule of the
// captured pair standing in for the daemon's socket mark.
func (b *bench) startCapturedTerminator(ctx context.Context, ts *netnslab.Pod) (*proc, error) {
	_, srvRules := capturedPairRules(ts.IP)
	if err := iptables(ctx, ts, srvRules); err != nil {
		return nil, err
	}
	crt, err := b.writeHAProxyCert(ctx, peerServerSA)
	if err != nil {
		return nil, err
	}
	cfg := haproxyTLSConfig(haproxyTerminate, fmt.Sprintf("0.0.0.0:%d", netnslab.InboundHBONEPort),
		netip.AddrPortFrom(ts.IP, appPort).String(), crt, b.caCert, "", "source 0.0.0.0 usesrc clientip")
	return b.runHAProxy(ctx, ts, "haproxy (captured mTLS terminator)", "haproxy-captured-tls.cfg", cfg, netnslab.InboundHBONEPort)
}

// addHAProxyCapturedTerminator adds the HAProxy mTLS terminator behind the
// capture rules (report.KeyHAProxyTLSCaptured), or lists it as skipped
// without HAProxy; like the captured pair, a failure fails the run.
func (b *bench) addHAProxyCapturedTerminator(ctx context.Context) error {
	if b.skipWithoutHAProxy("HAProxy mTLS terminator behind the capture rules (one hop)") {
		return nil
	}
	ts := b.cluster.Pods[podTermServer]
	p, err := b.startCapturedTerminator(ctx, ts)
	if err != nil {
		return err
	}
	hbone := netip.AddrPortFrom(ts.IP, netnslab.InboundHBONEPort)
	app := netip.AddrPortFrom(ts.IP, appPort)
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLSCaptured), Group: report.GroupHBONE1,
			Proxy: "HAProxy mTLS terminator behind the capture rules (the daemon's place)",
			Note: fmt.Sprintf("zload mTLS client in %s → %s (HAProxy, verify required) → %s from the client's address (usesrc clientip, %s captured)",
				podClient, hbone, app, podTermServer)},
		ns:    b.cluster.Pods[podClient].NS,
		args:  append([]string{"--tls", "--target", hbone.String(), "--san", spiffe(peerServerSA)}, b.certArgs(zloadSA)...),
		procs: []*proc{p},
	})
	return nil
}

// addHAProxyCapturedPair adds the HAProxy mTLS pair behind the capture
// rules (report.KeyHAProxyPairCaptured), or lists it as skipped without
// HAProxy.
func (b *bench) addHAProxyCapturedPair(ctx context.Context) error {
	if b.skipWithoutHAProxy("HAProxy mTLS pair behind the capture rules (two hops)") {
		return nil
	}
	hc, hs := b.cluster.Pods[podPairClient], b.cluster.Pods[podPairServer]
	// Unlike the explicit pair, a failure here fails the run: HAProxy
	// started for the other paths, so what failed is this lab's rules or
	// the transparent source, which the quick run exists to catch.
	pc, ps, err := b.startCapturedPair(ctx, hc, hs)
	if err != nil {
		return err
	}
	app := netip.AddrPortFrom(hs.IP, appPort)
	hbone := netip.AddrPortFrom(hs.IP, netnslab.InboundHBONEPort)
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPairCaptured), Group: report.GroupHBONE2,
			Proxy: "HAProxy mTLS pair behind the capture rules (the daemons' places)",
			Note: fmt.Sprintf("%s (captured, no daemon) → HAProxy on 15001 (original destination, PROXY v2) → mTLS, one TLS connection per connection → %s (HAProxy, accept-proxy) → %s from the client's address (usesrc clientip)",
				podPairClient, hbone, app)},
		ns: hc.NS, args: []string{"--target", app.String()}, procs: []*proc{pc, ps},
	})
	return nil
}
