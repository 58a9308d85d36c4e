package proxy

import (
	"fmt"
	"net"

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
	ci := newConnInfo(dirInbound, addrPortOf(c.RemoteAddr()))
	abort := func(err error) {
		p.failed(ci, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	dst, err := engine.OriginalDst(c)
	if err != nil {
		abort(err)
		return
	}
	ci.dst = dst
	if p.isIllegalPort(dst.Port()) {
		abort(fmt.Errorf("illegal target port %d", dst.Port()))
		return
	}
	w, snap, err := p.localWorkload(p.ctx)
	if err != nil {
		abort(err)
		return
	}
	ci.dstWorkload = w
	ci.srcWorkload = p.fetchWorkloadByAddr(p.ctx, snap, ci.src.Addr()) // ondemand.go
	p.open(ci)
	// What re-checks evaluate too (connmgr reads it from ci): no identity.
	dec := snap.Authorize(ci.PolicyConn())
	p.logDryRun(snap, ci.PolicyConn()) // dryrun.go
	if !dec.Allowed {
		p.complete(ci, withFlags(metrics.FlagDeny, errPolicyRejection(dec.Reason)))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	if !p.spoofsSource(ci.src.Addr(), dst) {
		// TCP to TCP with nothing to try first: the engine connects and
		// relays (on the epoll backend its event loop completes the
		// connect; a failed one reaches relayEnded as a connect error,
		// logged and counted as below).
		p.trackPolicy(ci, snap)
		p.relayed(c, ci)
		p.startDial(p.ctx, ci, c, &p.dialer, dst)
		return true
	}
	app, err := p.dialApp(p.ctx, ci.src.Addr(), dst)
	if err != nil {
		p.complete(ci, withFlags(metrics.FlagConnect, fmt.Errorf("connect to %s: %w", dst, err)))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	p.trackPolicy(ci, snap)
	// TCP to TCP: the engine's event loop owns the relay from here.
	p.relayed(c, ci)
	p.startRelay(ci, engine.TCPEndpoint{TCPConn: c}, engine.TCPEndpoint{TCPConn: app})
	return true
}
