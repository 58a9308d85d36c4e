package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/state"
)

// Inbound CONNECT authorities come in two forms: "ip:port", the pod address
// and the port to dial (direct HBONE), and "host:port", a service hostname
// and a service port (double HBONE through a network gateway, which routes
// by service). The second is resolved against the local workload: it must
// be an endpoint of that service, and the service port becomes its target
// port.

// maxHostnameLen is the longest DNS name (RFC 1035).
const maxHostnameLen = 253

// splitAuthority parses a CONNECT authority. For "ip:port" it returns the
// address and host ""; for "host:port" the host and a target holding only
// the port.
func splitAuthority(authority string) (host string, target netip.AddrPort, err error) {
	h, ps, err := net.SplitHostPort(authority)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("invalid authority %q: want ip:port or host:port", authority)
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 || ps[0] == '+' || len(ps) > 1 && ps[0] == '0' {
		return "", netip.AddrPort{}, fmt.Errorf("invalid authority %q: bad port %q", authority, ps)
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return "", netip.AddrPort{}, fmt.Errorf("invalid authority %q: zoned address", authority)
		}
		return "", netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
	}
	if !validHostname(h) {
		return "", netip.AddrPort{}, fmt.Errorf("invalid authority %q: %q is neither an IP address nor a hostname", authority, h)
	}
	return h, netip.AddrPortFrom(netip.Addr{}, uint16(port)), nil
}

// validHostname accepts DNS names: dot-separated labels of letters, digits
// and '-', none empty or longer than 63 bytes, not starting or ending with '-'.
func validHostname(h string) bool {
	if h == "" || len(h) > maxHostnameLen {
		return false
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 || h[i-1] == '-' {
				return false
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return false
			}
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0 && h[len(h)-1] != '-'
}

// hostAuthorityTarget resolves "host:svcPort" for the local workload w,
// reached on local: the service with that hostname that w is an endpoint
// of, and the port w serves it on (w's own mapping for the service, else the
// service's target port). The address is the one the tunnel arrived on, so
// validate_destination holds by construction. A service w does not serve is
// a 400 (the tunnel is not addressed to this pod); a port that cannot be
// resolved is a 503, as ztunnel answers.
func hostAuthorityTarget(snap *state.Snapshot, w *state.Workload, host string, svcPort uint16, local netip.Addr) (netip.AddrPort, error) {
	svc := endpointService(snap, w, host)
	if svc == nil {
		return netip.AddrPort{}, inboundErr(http.StatusBadRequest, "authority %s:%d: workload %s is not an endpoint of a service with that hostname", host, svcPort, w.UID)
	}
	if tp := w.Services[svc.Key()][svcPort]; tp != 0 {
		return netip.AddrPortFrom(local, tp), nil
	}
	if tp := svc.Ports[svcPort]; tp != 0 {
		return netip.AddrPortFrom(local, tp), nil
	}
	return netip.AddrPort{}, inboundErr(http.StatusServiceUnavailable, "authority %s:%d: service %s has no target port for port %d", host, svcPort, svc.Key(), svcPort)
}

// endpointService is the service with hostname host that w is an endpoint
// of, or nil.
func endpointService(snap *state.Snapshot, w *state.Workload, host string) *state.Service {
	for _, s := range snap.ServicesByHostname(host) {
		if _, ok := w.Services[s.Key()]; ok {
			return s
		}
	}
	return nil
}

// inboundSource finds the source workload for telemetry. A request that
// came from another network through its gateway (x-forwarded-network names
// a network other than ours) carries the gateway's address, not the
// client's, so it is not looked up by address: that would credit the
// gateway with the client's traffic.
func (rt *router) inboundSource(ctx context.Context, snap *state.Snapshot, req *hbone.ServerRequest, src netip.AddrPort) *state.Workload {
	if n := req.Header.Get(headerForwardedNetwork); n != "" && n != rt.network {
		rt.access.Debug("connection from another network through its gateway",
			"src.addr", src, "src.network", n, "dst.hbone_addr", req.Authority)
		return nil
	}
	return rt.fetchWorkloadByAddr(ctx, snap, src.Addr()) // ondemand.go
}
