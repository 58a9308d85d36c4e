package state

import (
	"math/bits"
	"net/netip"
)

// An address index (workloads by address, services by VIP) keys its entries
// by a network handle and the address's bytes rather than by a
// NetworkAddress (issue 36: its network string and 24-byte netip.Addr made
// a slot of the workload index 56 bytes, ~100 bytes per workload at the
// tables' load). IPv4 addresses, nearly all of a mesh's, go to a table of
// their own whose key is one word: a slot of the workload index is then 24
// bytes; an IPv6 slot is 40.

// netTable gives each network name of a snapshot's addresses a small handle
// (the default network "" is 0). It is immutable once its snapshot is
// built; a builder that meets a new name copies it first. A snapshot
// derived by Apply keeps its predecessor's handles, so a name stays in the
// table after its last address leaves, until a snapshot is built from
// scratch: the table holds the networks seen, a handful in any mesh.
type netTable struct {
	ids   map[string]uint32
	names []string // names[id-1] is the name of handle id
}

// id returns network's handle, and whether it has one.
func (t *netTable) id(network string) (uint32, bool) {
	if network == "" {
		return 0, true
	}
	if t == nil {
		return 0, false
	}
	id, ok := t.ids[network]
	return id, ok
}

// name returns the network name of handle id.
func (t *netTable) name(id uint32) string {
	if id == 0 {
		return ""
	}
	return t.names[id-1]
}

// addr6Key keys an IPv6 address: its 16 bytes as two big-endian words, and
// its network's handle.
type addr6Key struct {
	hi, lo uint64
	net    uint32
}

// addr4Key keys an IPv4 address: the network's handle in the top 32 bits,
// the address (big-endian) in the low 32.
func addr4Key(net uint32, ip netip.Addr) uint64 {
	a := ip.As4()
	return uint64(net)<<32 | uint64(a[0])<<24 | uint64(a[1])<<16 | uint64(a[2])<<8 | uint64(a[3])
}

func addr6KeyOf(net uint32, ip netip.Addr) addr6Key {
	a := ip.As16()
	return addr6Key{
		hi:  uint64(a[0])<<56 | uint64(a[1])<<48 | uint64(a[2])<<40 | uint64(a[3])<<32 | uint64(a[4])<<24 | uint64(a[5])<<16 | uint64(a[6])<<8 | uint64(a[7]),
		lo:  uint64(a[8])<<56 | uint64(a[9])<<48 | uint64(a[10])<<40 | uint64(a[11])<<32 | uint64(a[12])<<24 | uint64(a[13])<<16 | uint64(a[14])<<8 | uint64(a[15]),
		net: net,
	}
}

// mixAddr spreads x over the hash: the 128-bit product folded in two mixes
// every bit into both ends (the top bits pick the shard, the low ones the
// slot).
func mixAddr(x uint64) uint64 {
	hi, lo := bits.Mul64(x^0x243f6a8885a308d3, 0x9e3779b97f4a7c15)
	return nonzero(hi ^ lo)
}

func hashAddr4(k uint64) uint64 { return mixAddr(k) }

func hashAddr6(k addr6Key) uint64 {
	return mixAddr(k.lo ^ bits.RotateLeft64(k.hi, 32) ^ uint64(k.net)*0xff51afd7ed558ccd)
}

// addrIndex is an index by network and address.
type addrIndex[V any] struct {
	v4 shardMap[uint64, V]
	v6 shardMap[addr6Key, V]
}

// get returns the value under ip (unmapped, without a zone) on the network
// of handle net.
func (x *addrIndex[V]) get(net uint32, ip netip.Addr) V {
	if ip.Is4() {
		k := addr4Key(net, ip)
		return x.v4.get(hashAddr4(k), k)
	}
	k := addr6KeyOf(net, ip)
	return x.v6.get(hashAddr6(k), k)
}

// all calls f for every entry, in no order, with its address and network.
func (x *addrIndex[V]) all(nets *netTable, f func(NetworkAddress, V)) {
	x.v4.all(func(k uint64, v V) {
		a := netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)})
		f(NetworkAddress{nets.name(uint32(k >> 32)), a}, v)
	})
	x.v6.all(func(k addr6Key, v V) {
		var b [16]byte
		for i := range 8 {
			b[i], b[8+i] = byte(k.hi>>(56-8*i)), byte(k.lo>>(56-8*i))
		}
		f(NetworkAddress{nets.name(k.net), netip.AddrFrom16(b)}, v)
	})
}

// lookupAddr returns the handle of network and ip ready for an index
// lookup (unmapped), or false when nothing can be found under them: the
// snapshot has no address on that network, or ip has a zone (no indexed
// address has one).
func (s *Snapshot) lookupAddr(network string, ip netip.Addr) (uint32, netip.Addr, bool) {
	id, ok := s.nets.id(network)
	if !ok {
		return 0, ip, false
	}
	if ip.Is4() {
		return id, ip, true
	}
	ip = ip.Unmap()
	return id, ip, ip.Is4() || (ip.IsValid() && ip.Zone() == "")
}

// addrEdit writes to an addrIndex of a snapshot being built.
type addrEdit[V any] struct {
	v4 *shardEdit[uint64, V]
	v6 *shardEdit[addr6Key, V]
}

func newAddrEdit[V any](x *addrIndex[V], fresh bool, n int) addrEdit[V] {
	return addrEdit[V]{newShardEdit(&x.v4, hashAddr4, fresh, n), newShardEdit(&x.v6, hashAddr6, fresh, 0)}
}

func (e addrEdit[V]) finish() {
	e.v4.finish()
	e.v6.finish()
}

// netID returns the handle of network in the snapshot being built, giving
// it one when it has none (copying the table the snapshot shares).
func (b *builder) netID(network string) uint32 {
	s := b.s
	if id, ok := s.nets.id(network); ok {
		return id
	}
	if !b.ownNets {
		t := &netTable{ids: map[string]uint32{}}
		if s.nets != nil {
			for k, v := range s.nets.ids {
				t.ids[k] = v
			}
			t.names = append(t.names, s.nets.names...)
		}
		s.nets, b.ownNets = t, true
	}
	s.nets.names = append(s.nets.names, network)
	id := uint32(len(s.nets.names))
	s.nets.ids[network] = id
	return id
}

// getAddr returns the workload indexed under k (unmapped), or nil.
func (b *builder) getAddr(k NetworkAddress) *Workload {
	id, ok := b.s.nets.id(k.Network)
	if !ok {
		return nil
	}
	return b.s.byAddr.get(id, k.Addr)
}

// setAddr indexes w under k (unmapped).
func (b *builder) setAddr(k NetworkAddress, w *Workload) {
	id := b.netID(k.Network)
	if k.Addr.Is4() {
		b.byAddr.v4.set(addr4Key(id, k.Addr), w)
		return
	}
	b.byAddr.v6.set(addr6KeyOf(id, k.Addr), w)
}

// delAddr removes the entry under k (unmapped).
func (b *builder) delAddr(k NetworkAddress) {
	id, ok := b.s.nets.id(k.Network)
	if !ok {
		return
	}
	if k.Addr.Is4() {
		b.byAddr.v4.del(addr4Key(id, k.Addr))
		return
	}
	b.byAddr.v6.del(addr6KeyOf(id, k.Addr))
}

// insertVIP adds svc to the services under VIP k (unmapped), kept sorted
// by key; removeVIP removes it.
func (b *builder) insertVIP(k NetworkAddress, svc *Service) {
	id := b.netID(k.Network)
	if k.Addr.Is4() {
		insertService(b.svcByVIP.v4, b.svcByVIPM.v4, addr4Key(id, k.Addr), svc)
		return
	}
	insertService(b.svcByVIP.v6, b.svcByVIPM.v6, addr6KeyOf(id, k.Addr), svc)
}

func (b *builder) removeVIP(k NetworkAddress, svc *Service) {
	id, ok := b.s.nets.id(k.Network)
	if !ok {
		return
	}
	if k.Addr.Is4() {
		removeService(b.svcByVIP.v4, b.svcByVIPM.v4, addr4Key(id, k.Addr), svc)
		return
	}
	removeService(b.svcByVIP.v6, b.svcByVIPM.v6, addr6KeyOf(id, k.Addr), svc)
}
