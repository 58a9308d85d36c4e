package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/state"
)

// Inbound CONNECT authorities come in two forms: "ip:port", the pod address
// and the port to dial (direct HBONE), and "host:port", a service hostname
// and a service port (double HBONE through a network gateway, which routes
// by service). The second is resolved against the local workload: it must
// be an endpoint of that service, and the service port becomes its target
// port.
//
// Which form an authority is follows ztunnel exactly (HboneAddress, from
// the request's URI): it is an address only if the whole authority is a Rust
// SocketAddr ("a.b.c.d:port" or "[ipv6]:port", the IPv6 address with an
// optional numeric scope "%n"); anything else is a hostname, the URI's host,
// looked up among the services as it is. So "[::ffff:10.0.0.1]:80" is the
// IPv6 address ::ffff:10.0.0.1, which is not the IPv4 address the tunnel
// arrived on (400, ip mismatch), and "[10.0.0.1]:80" is the hostname
// "[10.0.0.1]", which no service has (503).

// splitAuthority parses a CONNECT authority. For "ip:port" it returns the
// address as written (an IPv4-mapped IPv6 address stays one; a numeric
// scope is dropped, as ztunnel compares addresses without it) and host "";
// for "host:port" the host and a target holding only the port. An empty
// host (":80") is an *inboundError, the 503 ztunnel answers.
//
// The authority must be one ztunnel's HTTP/2 server takes (the http crate's
// Authority: validURIAuthority) and carry a port, or the error is ztunnel's
// NoValidAuthority. Where ztunnel's parsers take a port of "0", "+80" or
// "080", we refuse it too (our own departure: it would at best fail its
// dial, after authorization).
func splitAuthority(authority string) (host string, target netip.AddrPort, err error) {
	if !validURIAuthority(authority) {
		return "", netip.AddrPort{}, fmt.Errorf("invalid authority %q: not an RFC 3986 authority", authority)
	}
	i := strings.LastIndexByte(authority, ':')
	if i < 0 {
		return "", netip.AddrPort{}, errNoValidAuthority(authority)
	}
	ps := authority[i+1:]
	port, err := strconv.ParseUint(strings.TrimPrefix(ps, "+"), 10, 16)
	if err != nil {
		// Not a u16 for Rust either (it takes one leading '+').
		return "", netip.AddrPort{}, errNoValidAuthority(authority)
	}
	if port == 0 || ps[0] == '0' || ps[0] == '+' {
		return "", netip.AddrPort{}, fmt.Errorf("%w (port must be 1-65535, without a sign or a leading zero)", errNoValidAuthority(authority))
	}
	if ip, ok := socketAddrIP(authority[:i]); ok {
		return "", netip.AddrPortFrom(ip, uint16(port)), nil
	}
	host = uriHost(authority)
	if host == "" {
		// ":80": ztunnel looks the empty hostname up and finds nothing.
		return "", netip.AddrPort{}, &inboundError{status: http.StatusServiceUnavailable, err: errNoHostname(host)}
	}
	return host, netip.AddrPortFrom(netip.Addr{}, uint16(port)), nil
}

// errNoValidAuthority is ztunnel's NoValidAuthority, in its words.
func errNoValidAuthority(authority string) error {
	return fmt.Errorf("no valid authority pseudo header: %s", authority)
}

// errNoHostname is ztunnel's NoHostname, in its words: no service has the
// authority's hostname.
func errNoHostname(host string) error {
	return fmt.Errorf("no service or workload for hostname: %s", host)
}

// socketAddrIP returns the address of hp, the authority before its port
// colon, when Rust's SocketAddr parser takes it: a dotted IPv4 address, or
// an IPv6 address in brackets with an optional "%<u32>" scope. Go's netip
// grammar is Rust's for these (four decimal octets without leading zeros;
// at most four hex digits a group, one "::", an embedded IPv4 address last).
func socketAddrIP(hp string) (netip.Addr, bool) {
	if in, ok := strings.CutPrefix(hp, "["); ok {
		in, ok = strings.CutSuffix(in, "]")
		if !ok {
			return netip.Addr{}, false
		}
		a, scope, scoped := strings.Cut(in, "%")
		if scoped && !isScopeID(scope) {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(a)
		if err != nil || !ip.Is6() {
			return netip.Addr{}, false
		}
		return ip, true
	}
	ip, err := netip.ParseAddr(hp)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, false
	}
	return ip, true
}

// isScopeID reports whether s is a decimal u32, as Rust reads an IPv6
// scope: digits only (leading zeros allowed), at most 2^32-1.
func isScopeID(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// uriHost is the host of a valid authority as the http crate's
// Authority::host returns it: after the last '@', either the bracketed
// part with its brackets or everything up to the first ':'.
func uriHost(authority string) string {
	hp := authority[strings.LastIndexByte(authority, '@')+1:]
	if strings.HasPrefix(hp, "[") {
		if j := strings.IndexByte(hp, ']'); j >= 0 {
			return hp[:j+1]
		}
		return hp
	}
	h, _, _ := strings.Cut(hp, ":")
	return h
}

// maxAuthorityColons is the http crate's MAX_COLONS: at most this many
// colons since the last '@' or ']' (an IPv6 address has seven).
const maxAuthorityColons = 8

// validURIAuthority reports whether s is an authority ztunnel's HTTP/2
// server takes as a CONNECT's :authority (the http crate's
// Authority::from_shared; h2 resets the stream of any other): not empty,
// only URI characters, '%' only in the userinfo or within brackets, one
// pair of brackets at most, at most one port colon, something after an
// '@', and no '/', '?' or '#'.
func validURIAuthority(s string) bool {
	if s == "" {
		return false
	}
	colons := 0
	open, closed, percent := false, false, false
	at := -1
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case b == '%':
			percent = true
		case b == ':':
			if colons >= maxAuthorityColons {
				return false
			}
			colons++
		case b == '[':
			if percent || open {
				return false
			}
			open = true
		case b == ']':
			if !open || closed {
				return false
			}
			closed, colons, percent = true, 0, false
		case b == '@':
			at, colons, percent = i, 0, false
		case !isAuthorityByte(b):
			return false // '/', '?' and '#' among them: they would end it
		}
	}
	return open == closed && colons <= 1 && at != len(s)-1 && !percent
}

// isAuthorityByte reports whether b may appear in an authority besides
// '%', ':', '[', ']' and '@' (the http crate's URI_CHARS, minus the
// characters that end an authority).
func isAuthorityByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!$&'()*+,-.;=_~", b) >= 0
}

// hostAuthorityTarget resolves "host:svcPort" for the local workload w,
// reached on local: the service with that hostname that w is an endpoint
// of, and the port w serves it on (w's own mapping for the service, else the
// service's target port). The address is the one the tunnel arrived on, so
// validate_destination holds by construction. A hostname no service has is
// a 503 with ztunnel's NoHostname error, and so is a port that cannot be
// resolved, as ztunnel answers. A service w does not serve is a 400 (the
// tunnel is not addressed to this pod): our departure, as ztunnel dials the
// service's target port on this pod anyway.
func hostAuthorityTarget(snap *state.Snapshot, w *state.Workload, host string, svcPort uint16, local netip.Addr) (netip.AddrPort, error) {
	svc := endpointService(snap, w, host)
	if svc == nil {
		if len(snap.ServicesByHostname(host)) == 0 {
			return netip.AddrPort{}, &inboundError{status: http.StatusServiceUnavailable, err: errNoHostname(host)}
		}
		return netip.AddrPort{}, inboundErr(http.StatusBadRequest, "authority %s:%d: workload %s is not an endpoint of a service with that hostname", host, svcPort, w.UID)
	}
	own, _ := w.Services.Ports(svc.Key())
	if tp, _ := own.Target(svcPort); tp != 0 {
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
		if w.Services.Has(s.Key()) {
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
