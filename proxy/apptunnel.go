package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/proxy/proxyproto"
	"github.com/ztunnel-go/ztunnel/state"
)

// proxyTunnel is w's application tunnel when it is of protocol PROXY: an
// inbound HBONE connection to w is then dialled by dialAppTunnel.
func proxyTunnel(w *state.Workload) *state.ApplicationTunnel {
	if w != nil && w.ApplicationTunnel() != nil && w.ApplicationTunnel().Protocol == state.AppTunnelProxy {
		return w.ApplicationTunnel()
	}
	return nil
}

// appTunnelWriteTimeout bounds writing the PROXY header to a fresh
// connection (it fits in the socket buffer, so only a stuck app waits).
const appTunnelWriteTimeout = 10 * time.Second

// dialAppTunnel connects to a workload that terminates tunnels itself
// (application_tunnel protocol PROXY): to the tunnel port (the target port
// when 0), over loopback unless DirectAppTunnel, and writes a PROXY v2
// header naming the client, tunnelDst (see tunnelTarget) and, in TLV 0xD0,
// the client's SPIFFE ID.
func (p *Proxy) dialAppTunnel(ctx context.Context, cn *conn, target, tunnelDst netip.AddrPort, port uint16) (*net.TCPConn, error) {
	if port == 0 {
		port = target.Port()
	}
	if p.isIllegalPort(port) {
		// The record names the port, but an own port would loop.
		return nil, fmt.Errorf("application tunnel: illegal port %d", port)
	}
	var (
		c   *net.TCPConn
		err error
	)
	if p.cfg.DirectAppTunnel {
		c, err = p.dialApp(ctx, cn.src.Addr(), netip.AddrPortFrom(target.Addr(), port))
	} else {
		// Over loopback the source cannot be the client's; the header says who it is.
		lo := netip.IPv6Loopback()
		if target.Addr().Is4() {
			lo = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
		c, err = p.dialer.Dial(ctx, netip.Addr{}, netip.AddrPortFrom(lo, port))
	}
	if err != nil {
		return nil, fmt.Errorf("application tunnel: %w", err)
	}
	h := proxyproto.Header{Command: proxyproto.Proxy, Src: cn.src, Dst: tunnelDst}
	if id := cn.srcID(); id != (identity.Identity{}) {
		h.TLVs = []proxyproto.TLV{{Type: proxyproto.TypeSPIFFEID, Value: []byte(id.String())}}
	}
	_ = c.SetWriteDeadline(time.Now().Add(appTunnelWriteTimeout))
	if _, err := h.WriteTo(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("application tunnel: write PROXY header: %w", err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// tunnelTarget is the destination the PROXY header of an application
// tunnel names, ztunnel's tunnel_target: the CONNECT authority as the client
// sent it when it is an address (for a waypoint, the address the client
// asked for, not the waypoint's own); for a service hostname, which PROXY
// cannot carry, a VIP of the service w serves it for (one on network first,
// then IPv4 first; of equals the last listed) with the authority's port.
func tunnelTarget(snap *state.Snapshot, w *state.Workload, host string, authority netip.AddrPort, network string) (netip.AddrPort, error) {
	if host == "" {
		return authority, nil
	}
	var (
		best  netip.Addr
		score = -1
	)
	if svc := endpointService(snap, w, host); svc != nil {
		for _, v := range svc.VIPs {
			sc := 0
			if v.Network == network {
				sc = 1
				if v.Addr.Is4() || v.Addr.Is4In6() {
					sc = 2
				}
			}
			if sc >= score { // of equals, the last (ztunnel's max_by_key)
				best, score = v.Addr.Unmap(), sc
			}
		}
	}
	if !best.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("application tunnel: no IP for service %s", host)
	}
	return netip.AddrPortFrom(best, authority.Port()), nil
}
