package proxy

import (
	"fmt"
	"net"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
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
	ci.srcWorkload = snap.WorkloadByAddr(p.cfg.Network, ci.src.Addr())
	p.open(ci)
	conn := state.Conn{Src: ci.src, Dst: dst, DstWorkload: w}
	dec := snap.Authorize(conn)
	if !dec.Allowed {
		p.complete(ci, metrics.FlagDeny, fmt.Errorf("connection rejected by policy: %s", dec.Reason))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	app, err := p.dialApp(p.ctx, ci.src.Addr(), dst)
	if err != nil {
		p.complete(ci, metrics.FlagConnect, fmt.Errorf("connect to %s: %w", dst, err))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	p.trackPolicy(ci, snap, conn)
	// TCP to TCP: the engine's event loop owns the relay from here.
	p.relayed(c, ci)
	ci.startRelay(engine.TCPEndpoint{TCPConn: c}, engine.TCPEndpoint{TCPConn: app}, func(res engine.Result) {
		flags, rerr := ci.relayOutcome(res)
		p.complete(ci, flags, rerr)
		p.cfg.Metrics.SocketClosed(metrics.ReporterDestination)
		p.release(ci)
	})
	return true
}
