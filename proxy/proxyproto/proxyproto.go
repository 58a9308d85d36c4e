package proxyproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// signature opens every version 2 header.
var signature = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// Sizes of the fixed parts of a header.
const (
	fixedLen = 16 // signature, version/command, family/protocol, length
	ipv4Len  = 4 + 4 + 2 + 2
	ipv6Len  = 16 + 16 + 2 + 2
	// MaxLen is the longest header: the fixed part and a 16-bit length.
	MaxLen = fixedLen + 0xFFFF
)

// Family/protocol bytes for the forms we write and accept.
const (
	famUnspec  = 0x00
	famTCPIPv4 = 0x11
	famTCPIPv6 = 0x21
)

// Command says whether the header describes a proxied connection.
type Command uint8

const (
	// Local is a connection the proxy made on its own behalf (health
	// checks); the receiver uses the real connection addresses.
	Local Command = 0x0
	// Proxy is a relayed connection; the header's addresses are the
	// original client and target.
	Proxy Command = 0x1
)

// TLV types the mesh uses.
const (
	// TypeSPIFFEID carries the client's SPIFFE identity (Istio's 0xD0).
	TypeSPIFFEID = 0xD0
	// TypeServiceHostname is reserved by Istio's workload API for the
	// service hostname; ztunnel does not write it.
	TypeServiceHostname = 0xD1
)

// TLV is one type-length-value field after the addresses.
type TLV struct {
	Type  byte
	Value []byte
}

// Header is a PROXY v2 header. Src and Dst are both set (TCP over IPv4 when
// both are IPv4, else over IPv6) or both unset (address family UNSPEC).
type Header struct {
	Command  Command
	Src, Dst netip.AddrPort
	TLVs     []TLV
}

// Errors of the parser; each is wrapped with details.
var (
	// ErrNotProxy means the bytes do not start with the v2 signature.
	ErrNotProxy = errors.New("proxyproto: no PROXY v2 signature")
	// ErrInvalid means a header that breaks the format.
	ErrInvalid = errors.New("proxyproto: invalid header")
	// ErrUnsupported means a valid header of a kind this package does not
	// handle (UDP, UNIX sockets).
	ErrUnsupported = errors.New("proxyproto: unsupported header")
)

// TLV returns the value of the first TLV of type typ.
func (h *Header) TLV(typ byte) ([]byte, bool) {
	for _, t := range h.TLVs {
		if t.Type == typ {
			return t.Value, true
		}
	}
	return nil, false
}

// AppendBinary appends the encoded header to b.
func (h *Header) AppendBinary(b []byte) ([]byte, error) {
	if h.Command != Local && h.Command != Proxy {
		return nil, fmt.Errorf("proxyproto: command %#x", uint8(h.Command))
	}
	if h.Src.IsValid() != h.Dst.IsValid() {
		return nil, errors.New("proxyproto: source and destination must both be set or both unset")
	}
	src, dst := h.Src.Addr().Unmap(), h.Dst.Addr().Unmap()
	fam, n := byte(famUnspec), 0
	switch {
	case !h.Src.IsValid():
	case src.Is4() && dst.Is4():
		fam, n = famTCPIPv4, ipv4Len
	default:
		// Mixed families travel as IPv6, the IPv4 side v4-mapped.
		fam, n = famTCPIPv6, ipv6Len
	}
	for _, t := range h.TLVs {
		if len(t.Value) > 0xFFFF {
			return nil, fmt.Errorf("proxyproto: TLV %#x value of %d bytes", t.Type, len(t.Value))
		}
		n += 3 + len(t.Value)
	}
	if n > 0xFFFF {
		return nil, fmt.Errorf("proxyproto: header body of %d bytes exceeds 65535", n)
	}
	b = append(b, signature[:]...)
	b = append(b, 0x20|byte(h.Command), fam)
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	switch fam {
	case famTCPIPv4:
		s, d := src.As4(), dst.As4()
		b = append(append(b, s[:]...), d[:]...)
	case famTCPIPv6:
		s, d := src.As16(), dst.As16()
		b = append(append(b, s[:]...), d[:]...)
	}
	if fam != famUnspec {
		b = binary.BigEndian.AppendUint16(b, h.Src.Port())
		b = binary.BigEndian.AppendUint16(b, h.Dst.Port())
	}
	for _, t := range h.TLVs {
		b = append(b, t.Type)
		b = binary.BigEndian.AppendUint16(b, uint16(len(t.Value)))
		b = append(b, t.Value...)
	}
	return b, nil
}

// WriteTo writes the header to w with one Write.
func (h *Header) WriteTo(w io.Writer) (int64, error) {
	b, err := h.AppendBinary(make([]byte, 0, fixedLen+ipv6Len+64))
	if err != nil {
		return 0, err
	}
	n, err := w.Write(b)
	return int64(n), err
}

// Parse parses the header at the start of b and returns it with the number
// of bytes it took. A b too short for the header it starts returns
// io.ErrUnexpectedEOF.
func Parse(b []byte) (*Header, int, error) {
	if len(b) < fixedLen {
		if !bytes.HasPrefix(signature[:], b[:min(len(b), len(signature))]) {
			return nil, 0, ErrNotProxy
		}
		return nil, 0, io.ErrUnexpectedEOF
	}
	if [12]byte(b[:12]) != signature {
		return nil, 0, ErrNotProxy
	}
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if len(b) < fixedLen+n {
		return nil, 0, fmt.Errorf("%w: %d body bytes announced, %d present", io.ErrUnexpectedEOF, n, len(b)-fixedLen)
	}
	h, err := parseBody(b[12], b[13], b[fixedLen:fixedLen+n])
	if err != nil {
		return nil, 0, err
	}
	return h, fixedLen + n, nil
}

// Read reads exactly one header from r, and nothing after it.
func Read(r io.Reader) (*Header, error) {
	var fixed [fixedLen]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, fmt.Errorf("proxyproto: read header: %w", err)
	}
	if [12]byte(fixed[:12]) != signature {
		return nil, ErrNotProxy
	}
	// Check what can be checked before trusting the length with a buffer.
	if err := checkFixed(fixed[12], fixed[13]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint16(fixed[14:16]))
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("proxyproto: read header body: %w", err)
	}
	return parseBody(fixed[12], fixed[13], body)
}

func checkFixed(verCmd, fam byte) error {
	if verCmd>>4 != 2 {
		return fmt.Errorf("%w: version %d", ErrInvalid, verCmd>>4)
	}
	if cmd := Command(verCmd & 0x0F); cmd != Local && cmd != Proxy {
		return fmt.Errorf("%w: command %#x", ErrInvalid, uint8(cmd))
	}
	switch fam {
	case famUnspec, famTCPIPv4, famTCPIPv6:
		return nil
	case 0x12, 0x22, 0x31, 0x32:
		return fmt.Errorf("%w: family/protocol %#x", ErrUnsupported, fam)
	}
	return fmt.Errorf("%w: family/protocol %#x", ErrInvalid, fam)
}

func parseBody(verCmd, fam byte, body []byte) (*Header, error) {
	if err := checkFixed(verCmd, fam); err != nil {
		return nil, err
	}
	h := &Header{Command: Command(verCmd & 0x0F)}
	switch fam {
	case famTCPIPv4:
		if len(body) < ipv4Len {
			return nil, fmt.Errorf("%w: %d bytes for IPv4 addresses", ErrInvalid, len(body))
		}
		src, dst := netip.AddrFrom4([4]byte(body[0:4])), netip.AddrFrom4([4]byte(body[4:8]))
		h.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(body[8:10]))
		h.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(body[10:12]))
		body = body[ipv4Len:]
	case famTCPIPv6:
		if len(body) < ipv6Len {
			return nil, fmt.Errorf("%w: %d bytes for IPv6 addresses", ErrInvalid, len(body))
		}
		src, dst := netip.AddrFrom16([16]byte(body[0:16])), netip.AddrFrom16([16]byte(body[16:32]))
		h.Src = netip.AddrPortFrom(src.Unmap(), binary.BigEndian.Uint16(body[32:34]))
		h.Dst = netip.AddrPortFrom(dst.Unmap(), binary.BigEndian.Uint16(body[34:36]))
		body = body[ipv6Len:]
	}
	for len(body) > 0 {
		if len(body) < 3 {
			return nil, fmt.Errorf("%w: %d trailing bytes are not a TLV", ErrInvalid, len(body))
		}
		typ, n := body[0], int(binary.BigEndian.Uint16(body[1:3]))
		if len(body)-3 < n {
			return nil, fmt.Errorf("%w: TLV %#x announces %d bytes, %d present", ErrInvalid, typ, n, len(body)-3)
		}
		// Copy: the header outlives the caller's buffer.
		h.TLVs = append(h.TLVs, TLV{Type: typ, Value: bytes.Clone(body[3 : 3+n : 3+n])})
		body = body[3+n:]
	}
	return h, nil
}
