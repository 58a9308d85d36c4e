package rawtcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// TCP header flags (RFC 9293 section 3.1).
const (
	FlagFIN uint8 = 1 << 0
	FlagSYN uint8 = 1 << 1
	FlagRST uint8 = 1 << 2
	FlagPSH uint8 = 1 << 3
	FlagACK uint8 = 1 << 4
)

const (
	protoTCP    = 6
	ipv4HdrLen  = 20
	ipv6HdrLen  = 40
	tcpHdrLen   = 20
	defaultTTL  = 64
	optMSS      = 2 // TCP option kind: maximum segment size
	optMSSLen   = 4
	maxIPv4Pkt  = 0xffff
	maxIPv6Body = 0xffff
)

// ErrNotTCP is returned by Parse for a well-formed IP packet that carries
// something other than TCP (or IPv6 extension headers, which this parser
// does not follow): not an error of the packet, just not ours.
var ErrNotTCP = errors.New("rawtcp: not a TCP packet")

// errMalformed wraps every reason Parse refuses a packet.
var errMalformed = errors.New("rawtcp: malformed packet")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// Segment is one TCP segment together with the addresses of the IP packet
// that carries it.
type Segment struct {
	// Src and Dst are the packet's addresses and the segment's ports. Both
	// are IPv4 for an IPv4 packet, both IPv6 (v4-mapped ones kept as such)
	// for an IPv6 packet.
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	// MSS, when not zero, is sent as the maximum segment size option (in a
	// SYN). Parse does not read options back.
	MSS     uint16
	Payload []byte
}

// Has reports whether every flag of f is set on s.
func (s *Segment) Has(f uint8) bool { return s.Flags&f == f }

// String describes the segment for logs, tcpdump-like.
func (s *Segment) String() string {
	names := ""
	for i, n := range []string{"F", "S", "R", "P", "."} {
		if s.Flags&(1<<i) != 0 {
			names += n
		}
	}
	return fmt.Sprintf("%s > %s [%s] seq %d ack %d win %d len %d", s.Src, s.Dst, names, s.Seq, s.Ack, s.Window, len(s.Payload))
}

// Marshal returns the IP packet carrying s: IPv4 when both addresses are
// IPv4, IPv6 when both are IPv6 (an IPv4 address may not face an IPv6 one;
// v4-mapped IPv6 addresses are IPv6 here, written as they are).
func (s *Segment) Marshal() ([]byte, error) {
	src, dst := s.Src.Addr(), s.Dst.Addr()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("rawtcp: addresses %v and %v are not of one IP version", src, dst)
	}
	optLen := 0
	if s.MSS != 0 {
		optLen = optMSSLen
	}
	tcpLen := tcpHdrLen + optLen + len(s.Payload)
	ipLen := ipv6HdrLen
	if src.Is4() {
		ipLen = ipv4HdrLen
		if ipLen+tcpLen > maxIPv4Pkt {
			return nil, fmt.Errorf("rawtcp: segment of %d bytes too long for IPv4", tcpLen)
		}
	} else if tcpLen > maxIPv6Body {
		return nil, fmt.Errorf("rawtcp: segment of %d bytes too long for IPv6", tcpLen)
	}
	pkt := make([]byte, ipLen+tcpLen)
	if src.Is4() {
		h := pkt[:ipv4HdrLen]
		h[0] = 4<<4 | ipv4HdrLen/4
		binary.BigEndian.PutUint16(h[2:], uint16(len(pkt)))
		binary.BigEndian.PutUint16(h[6:], 0x4000) // don't fragment
		h[8] = defaultTTL
		h[9] = protoTCP
		a, b := src.As4(), dst.As4()
		copy(h[12:16], a[:])
		copy(h[16:20], b[:])
		binary.BigEndian.PutUint16(h[10:], checksum(0, h))
	} else {
		h := pkt[:ipv6HdrLen]
		h[0] = 6 << 4
		binary.BigEndian.PutUint16(h[4:], uint16(tcpLen))
		h[6] = protoTCP
		h[7] = defaultTTL
		a, b := src.As16(), dst.As16()
		copy(h[8:24], a[:])
		copy(h[24:40], b[:])
	}
	t := pkt[ipLen:]
	binary.BigEndian.PutUint16(t[0:], s.Src.Port())
	binary.BigEndian.PutUint16(t[2:], s.Dst.Port())
	binary.BigEndian.PutUint32(t[4:], s.Seq)
	binary.BigEndian.PutUint32(t[8:], s.Ack)
	t[12] = byte((tcpHdrLen + optLen) / 4 << 4)
	t[13] = s.Flags
	binary.BigEndian.PutUint16(t[14:], s.Window)
	if s.MSS != 0 {
		t[20], t[21] = optMSS, optMSSLen
		binary.BigEndian.PutUint16(t[22:], s.MSS)
	}
	copy(t[tcpHdrLen+optLen:], s.Payload)
	binary.BigEndian.PutUint16(t[16:], checksum(pseudoHeaderSum(src, dst, len(t)), t))
	return pkt, nil
}

// Parse decodes an IPv4 or IPv6 packet carrying one TCP segment. It refuses
// anything malformed: a short or truncated packet, a wrong version, an IPv4
// header checksum that does not verify, a fragment, a TCP header whose data
// offset does not fit, and, when verifyTCP is set, a TCP checksum that does
// not verify (the caller clears it only when the kernel says the checksum
// was offloaded and is not filled in yet). Bytes after the IP packet's own
// length (an Ethernet frame's padding) are ignored. The segment's Payload
// aliases pkt.
func Parse(pkt []byte, verifyTCP bool) (Segment, error) {
	if len(pkt) == 0 {
		return Segment{}, malformed("empty")
	}
	var (
		src, dst netip.Addr
		body     []byte
	)
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < ipv4HdrLen {
			return Segment{}, malformed("IPv4 header of %d bytes", len(pkt))
		}
		ihl := int(pkt[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		if ihl < ipv4HdrLen || total < ihl || total > len(pkt) {
			return Segment{}, malformed("IPv4 header length %d, total length %d, %d bytes received", ihl, total, len(pkt))
		}
		if checksum(0, pkt[:ihl]) != 0 {
			return Segment{}, malformed("IPv4 header checksum")
		}
		if frag := binary.BigEndian.Uint16(pkt[6:]); frag&0x3fff != 0 {
			return Segment{}, malformed("IPv4 fragment (flags and offset %#04x)", frag)
		}
		if pkt[9] != protoTCP {
			return Segment{}, ErrNotTCP
		}
		src = netip.AddrFrom4([4]byte(pkt[12:16]))
		dst = netip.AddrFrom4([4]byte(pkt[16:20]))
		body = pkt[ihl:total]
	case 6:
		if len(pkt) < ipv6HdrLen {
			return Segment{}, malformed("IPv6 header of %d bytes", len(pkt))
		}
		plen := int(binary.BigEndian.Uint16(pkt[4:]))
		if ipv6HdrLen+plen > len(pkt) {
			return Segment{}, malformed("IPv6 payload length %d, %d bytes received", plen, len(pkt))
		}
		if pkt[6] != protoTCP {
			return Segment{}, ErrNotTCP
		}
		src = netip.AddrFrom16([16]byte(pkt[8:24]))
		dst = netip.AddrFrom16([16]byte(pkt[24:40]))
		body = pkt[ipv6HdrLen : ipv6HdrLen+plen]
	default:
		return Segment{}, malformed("IP version %d", pkt[0]>>4)
	}
	if len(body) < tcpHdrLen {
		return Segment{}, malformed("TCP header of %d bytes", len(body))
	}
	off := int(body[12]>>4) * 4
	if off < tcpHdrLen || off > len(body) {
		return Segment{}, malformed("TCP data offset %d in a segment of %d bytes", off, len(body))
	}
	if body[12]&0x0f != 0 {
		return Segment{}, malformed("reserved TCP header bits set")
	}
	if verifyTCP && checksum(pseudoHeaderSum(src, dst, len(body)), body) != 0 {
		return Segment{}, malformed("TCP checksum")
	}
	return Segment{
		Src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(body[0:])),
		Dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(body[2:])),
		Seq:     binary.BigEndian.Uint32(body[4:]),
		Ack:     binary.BigEndian.Uint32(body[8:]),
		Flags:   body[13],
		Window:  binary.BigEndian.Uint16(body[14:]),
		Payload: body[off:],
	}, nil
}

// pseudoHeaderSum is the unfolded sum of the TCP pseudo-header (RFC 9293
// section 3.1 for IPv4, RFC 8200 section 8.1 for IPv6).
func pseudoHeaderSum(src, dst netip.Addr, tcpLen int) uint32 {
	var sum uint32
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		sum = sum16(sum16(0, a[:]), b[:])
	} else {
		a, b := src.As16(), dst.As16()
		sum = sum16(sum16(0, a[:]), b[:])
	}
	return sum + protoTCP + uint32(tcpLen)
}

// sum16 adds b as big-endian 16-bit words (an odd last byte padded with
// zero) to sum, unfolded.
func sum16(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// checksum is the Internet checksum (RFC 1071) of b with initial unfolded
// sum init. Over data whose checksum field is filled in, it is 0.
func checksum(init uint32, b []byte) uint16 {
	sum := sum16(init, b)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
