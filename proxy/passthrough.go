package proxy

import (
	"fmt"
	"net"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/state"
)

// handlePassthrough serves plaintext captured into the pod (15006): policy
// with no peer identity (so STRICT mTLS refuses it), then plain TCP to the app.
func (p *Proxy) handlePassthrough(c *net.TCPConn) {
	log := newAccessLog("inbound")
	src := addrPortOf(c.RemoteAddr())
	log.add("src.addr", src.String())
	abort := func(err error) {
		log.failed(p.log, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	dst, err := engine.OriginalDst(c)
	if err != nil {
		abort(err)
		return
	}
	log.add("dst.addr", dst.String())
	if p.isIllegalPort(dst.Port()) {
		abort(fmt.Errorf("illegal target port %d", dst.Port()))
		return
	}
	w, snap, err := p.localWorkload(p.ctx)
	if err != nil {
		abort(err)
		return
	}
	log.add("dst.workload", w.Name)
	log.add("dst.namespace", w.Namespace)
	if sw := snap.WorkloadByAddr(p.cfg.Network, src.Addr()); sw != nil {
		log.add("src.workload", sw.Name)
		log.add("src.namespace", sw.Namespace)
	}
	dec := snap.Authorize(state.Conn{Src: src, Dst: dst, DstWorkload: w})
	if !dec.Allowed {
		abort(fmt.Errorf("connection rejected by policy: %s", dec.Reason))
		return
	}
	app, err := p.dialApp(p.ctx, src.Addr(), dst)
	if err != nil {
		abort(fmt.Errorf("connect to %s: %w", dst, err))
		return
	}
	var counters engine.Counters
	res := engine.Relay(engine.TCPEndpoint{TCPConn: c}, engine.TCPEndpoint{TCPConn: app}, &counters)
	log.complete(p.log, counters.AToB.Load(), counters.BToA.Load(), res.Err)
}
