package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ztunnel-go/ztunnel/state"
)

// What the proxy may dial on a peer's word (issue 32). Two paths dial an
// address a packet named: plaintext inbound (15006) dials the captured
// connection's original destination, and outbound dials where the app was
// going. Istio's capture rules redirect everything but 127.0.0.1/32 and
// ::1/128, so a packet crafted on the pod's link for 0.0.0.0, a v4-mapped
// loopback or a host behind the pod arrives on 15006 with that address as
// its original destination. Dialed as-is (ztunnel does), the pod's loopback
// services and everything the pod can reach become the attacker's.
//
// The rules, one per dialing path:
//
//   - Inbound (15006 and the app dial of an HBONE stream) dials only an
//     address of the served workload itself, after unmapping, on a port that
//     is not one of the proxy's own (checkInboundTarget).
//   - Outbound never dials one of the proxy's own listeners: a destination
//     on an own port at a local address is refused, both as the app named it
//     and as the route resolved it (isSelfTarget). The proxy's sockets carry
//     the mark the capture rules exempt, so its dials are never redirected:
//     a dial lands on its own listener only when the address it names is
//     the listener's, which is what these checks recognise. A connection
//     accepted on 15001 whose original destination is an own port at a local
//     address was addressed to the listener itself (captured traffic is
//     redirected, so its original destination is elsewhere): refusing it
//     breaks any loop at its first hop, whatever the address.

// checkInboundTarget returns an error unless dst, the address an inbound
// path is about to dial for workload w, is one of w's own addresses (after
// unmapping) on a port that is not the proxy's own. The error names what
// was refused; dst itself comes from the network, so nothing else is done
// with it.
func (p *Proxy) checkInboundTarget(dst netip.AddrPort, w *state.Workload) error {
	a := dst.Addr().Unmap()
	switch {
	case p.isIllegalPort(dst.Port()):
		return fmt.Errorf("illegal target port %d", dst.Port())
	case a.IsUnspecified(), a.IsMulticast(), !a.IsValid():
		return fmt.Errorf("refused destination %s: not a workload address", dst)
	case !hasAddress(w, a):
		what := "an address of another host"
		if a.IsLoopback() {
			what = "a loopback address"
		}
		return fmt.Errorf("refused destination %s: %s, not one of workload %s's", dst, what, w.Name)
	}
	return nil
}

// isSelfTarget reports whether a connection to dst would land on one of the
// proxy's own listeners: an own port at a local address, that is loopback,
// unspecified, one of the served workload's addresses or local, the
// address the connection in hand was accepted on (which covers local
// addresses the workload record does not list, such as a secondary
// interface's). w may be nil before the workload is known.
func (p *Proxy) isSelfTarget(dst netip.AddrPort, w *state.Workload, local netip.Addr) bool {
	if !p.isIllegalPort(dst.Port()) {
		return false
	}
	a := dst.Addr().Unmap()
	if a.IsLoopback() || a.IsUnspecified() || (local.IsValid() && a == local.Unmap()) {
		return true
	}
	return w != nil && hasAddress(w, a)
}

// hasAddress reports whether a (unmapped) is one of w's addresses.
func hasAddress(w *state.Workload, a netip.Addr) bool {
	return slices.ContainsFunc(w.Addresses, func(wa netip.Addr) bool { return wa.Unmap() == a })
}
