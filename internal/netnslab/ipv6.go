package netnslab

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// IPv6 for pods: each node's IPv6 pod network and a pod's address in it.

// PodCIDR6 is the node's IPv6 pod network, fd00:10:244:N::/64, whose first
// address Gateway6 the node's pod bridge takes when a pod of the node gets
// IPv6 (Pod.EnableIPv6).
func (n *Node) PodCIDR6() netip.Prefix {
	a := podSupernet6.As16()
	binary.BigEndian.PutUint16(a[6:], uint16(n.index))
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// Gateway6 is the pods' IPv6 gateway on this node (see PodCIDR6).
func (n *Node) Gateway6() netip.Addr { return n.PodCIDR6().Addr().Next() }

// EnableIPv6 gives the pod an IPv6 address, fd00:10:244:N::(P+2)/64 (the
// same numbering as IP), on its eth0, and its node's pod bridge
// Gateway6, with a default IPv6 route through it: pods of one node then
// reach each other over IPv6 on their shared bridge. The lab routes no IPv6
// between nodes. Addresses skip duplicate address detection, so they are
// usable at once. A second call is a no-op.
func (p *Pod) EnableIPv6() error {
	return p.changeLocked(func(l *Lab) error {
		if p.IP6.IsValid() {
			return nil
		}
		n := p.Node
		a := n.PodCIDR6().Addr().As16()
		binary.BigEndian.PutUint16(a[14:], uint16(p.index+2))
		ip6 := netip.AddrFrom16(a)
		// "replace" is idempotent: the node's address is set by its
		// first pod that gets IPv6 and stays.
		if err := ipBatch6(l.logf, n.NetNS,
			fmt.Sprintf("addr replace %s/64 dev cbr0 nodad", n.Gateway6()),
		); err != nil {
			return err
		}
		if err := ipBatch6(l.logf, p.NetNS,
			fmt.Sprintf("addr add %s/64 dev eth0 nodad", ip6),
			fmt.Sprintf("route add default via %s dev eth0", n.Gateway6()),
		); err != nil {
			return err
		}
		p.IP6 = ip6
		return nil
	})
}
