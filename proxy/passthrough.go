package proxy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/metrics"
)

// handlePassthrough serves plaintext captured into the pod (15006): policy
// with no peer identity (so STRICT mTLS refuses it), then plain TCP to the app.
func (p *Proxy) handlePassthrough(c *net.TCPConn) (handedOff bool) {
	p.cfg.Metrics.SocketOpened(metrics.ReporterDestination)
	defer func() {
		if !handedOff {
			p.cfg.Metrics.SocketClosed(metrics.ReporterDestination)
		}
	}()
	cn := newConn(p, dirInbound, addrPortOf(c.RemoteAddr()))
	abort := func(err error) {
		cn.fail(err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	dst, err := engine.OriginalDst(c)
	if err != nil {
		abort(err)
		return
	}
	cn.dst = dst
	if p.isIllegalPort(dst.Port()) {
		abort(fmt.Errorf("illegal target port %d", dst.Port()))
		return
	}
	w, snap, err := p.router.localWorkload(p.ctx)
	if err != nil {
		abort(err)
		return
	}
	// The original destination came from the packet: dial it only when it
	// is this workload's own address (dialguard.go), never the pod's
	// loopback, an unspecified address or a host behind the pod.
	if err := p.checkInboundTarget(dst, w); err != nil {
		abort(err)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	cn.dst = dst
	cn.dstWorkload = w
	cn.srcWorkload = p.router.fetchWorkloadByAddr(p.ctx, snap, cn.src.Addr()) // ondemand.go
	cn.open()
	// What re-checks evaluate too (connmgr reads it from cn): no identity.
	dec := snap.Authorize(cn.PolicyConn())
	p.logDryRun(snap, cn.PolicyConn()) // dryrun.go
	if !dec.Allowed {
		cn.end(withFlags(metrics.FlagDeny, errPolicyRejection(dec.Reason)))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	if !p.spoofsSource(cn.src.Addr(), dst) {
		// TCP to TCP with nothing to try first: the engine connects and
		// relays (on the epoll backend its event loop completes the
		// connect; a failed one reaches relayEnded as a connect error,
		// logged and counted as below).
		cn.trackPolicy(snap)
		cn.listAccepted(c)
		cn.relayDial(p.ctx, c, &p.dialer, dst)
		return true
	}
	app, err := p.dialApp(p.ctx, cn.src.Addr(), dst)
	if err != nil {
		cn.end(withFlags(metrics.FlagConnect, fmt.Errorf("connect to %s: %w", dst, err)))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	cn.trackPolicy(snap)
	// TCP to TCP: the engine's event loop owns the relay from here.
	cn.listAccepted(c)
	cn.relay(engine.TCPEndpoint{TCPConn: c}, engine.TCPEndpoint{TCPConn: app})
	return true
}
