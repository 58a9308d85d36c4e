package rawtcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// TestChecksumRFC1071 checks the checksum against RFC 1071's worked example
// (section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2).
func TestChecksumRFC1071(t *testing.T) {
	if got := checksum(0, []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}); got != ^uint16(0xddf2) {
		t.Fatalf("checksum = %#04x, want %#04x", got, ^uint16(0xddf2))
	}
	// An odd length is padded with a zero byte.
	if got, want := checksum(0, []byte{0x01}), ^uint16(0x0100); got != want {
		t.Fatalf("odd checksum = %#04x, want %#04x", got, want)
	}
}

func TestMarshalParseRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst string
	}{
		{"IPv4", "10.244.0.3:20001", "10.244.0.2:8080"},
		{"IPv4 to 0.0.0.0", "10.244.0.3:20001", "0.0.0.0:9999"},
		{"IPv6", "[fd00::3]:20001", "[fd00::2]:8080"},
		{"IPv6 to a v4-mapped loopback", "[fd00::3]:20001", "[::ffff:127.0.0.1]:9999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Segment{
				Src: netip.MustParseAddrPort(tc.src), Dst: netip.MustParseAddrPort(tc.dst),
				Seq: 0xfffffff0, Ack: 7, Flags: FlagACK | FlagPSH, Window: 1234, Payload: []byte("GET / HTTP/1.1\r\n\r\n"),
			}
			pkt, err := in.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			out, err := Parse(pkt, true)
			if err != nil {
				t.Fatal(err)
			}
			if out.Src != in.Src || out.Dst != in.Dst || out.Seq != in.Seq || out.Ack != in.Ack ||
				out.Flags != in.Flags || out.Window != in.Window || !bytes.Equal(out.Payload, in.Payload) {
				t.Fatalf("parsed %v, want %v", out.String(), in.String())
			}
			// The MSS option lengthens the header; the payload still
			// starts after it.
			in.Flags, in.MSS = FlagSYN, 1200
			pkt, err = in.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if out, err = Parse(pkt, true); err != nil || !bytes.Equal(out.Payload, in.Payload) || !out.Has(FlagSYN) {
				t.Fatalf("SYN with MSS: %v, %v", out.String(), err)
			}
		})
	}
}

func TestMarshalRefusesMixedVersions(t *testing.T) {
	s := Segment{Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("[::ffff:127.0.0.1]:2")}
	if _, err := s.Marshal(); err == nil {
		t.Fatal("an IPv4 source facing a v4-mapped IPv6 destination was marshalled")
	}
}

// fixIPv4 recomputes an IPv4 header's checksum after a test changed it, so
// that Parse gets past it to the check the test aims at.
func fixIPv4(pkt []byte) []byte {
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < ipv4HdrLen || ihl > len(pkt) {
		ihl = ipv4HdrLen
	}
	binary.BigEndian.PutUint16(pkt[10:], 0)
	binary.BigEndian.PutUint16(pkt[10:], checksum(0, pkt[:ihl]))
	return pkt
}

func TestParseIsStrict(t *testing.T) {
	seg := func(src, dst string) []byte {
		s := Segment{Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst), Flags: FlagACK, Payload: []byte("banner")}
		pkt, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return pkt
	}
	v4 := func() []byte { return seg("10.0.0.2:80", "10.0.0.3:20001") }
	v6 := func() []byte { return seg("[fd00::2]:80", "[fd00::3]:20001") }
	for _, tc := range []struct {
		name   string
		pkt    []byte
		verify bool
		want   error // nil: parses
	}{
		{"empty", nil, true, errMalformed},
		{"IP version 5", append([]byte{0x50}, v4()[1:]...), true, errMalformed},
		{"IPv4 header cut short", v4()[:12], true, errMalformed},
		{"IPv4 header length below 20", func() []byte { p := v4(); p[0] = 0x44; return fixIPv4(p) }(), true, errMalformed},
		{"IPv4 total length beyond the packet", func() []byte {
			p := v4()
			binary.BigEndian.PutUint16(p[2:], uint16(len(p)+1))
			return fixIPv4(p)
		}(), true, errMalformed},
		{"IPv4 header checksum wrong", func() []byte { p := v4(); p[8]--; return p }(), true, errMalformed},
		{"IPv4 first fragment", func() []byte { p := v4(); p[6] |= 0x20; return fixIPv4(p) }(), true, errMalformed},
		{"IPv4 later fragment", func() []byte { p := v4(); p[7] = 1; return fixIPv4(p) }(), true, errMalformed},
		{"IPv4 UDP", func() []byte { p := v4(); p[9] = 17; return fixIPv4(p) }(), true, ErrNotTCP},
		{"IPv6 header cut short", v6()[:30], true, errMalformed},
		{"IPv6 payload length beyond the packet", func() []byte {
			p := v6()
			binary.BigEndian.PutUint16(p[4:], uint16(len(p)))
			return p
		}(), true, errMalformed},
		{"IPv6 extension header", func() []byte { p := v6(); p[6] = 0; return p }(), true, ErrNotTCP},
		{"TCP header cut short", func() []byte {
			p := v4()[:ipv4HdrLen+10]
			binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
			return fixIPv4(p)
		}(), true, errMalformed},
		{"TCP data offset below 5", func() []byte { p := v4(); p[ipv4HdrLen+12] = 4 << 4; return p }(), false, errMalformed},
		{"TCP data offset beyond the segment", func() []byte { p := v4(); p[ipv4HdrLen+12] = 15 << 4; return p }(), false, errMalformed},
		{"reserved TCP bits", func() []byte { p := v4(); p[ipv4HdrLen+12] |= 1; return p }(), false, errMalformed},
		{"TCP checksum wrong", func() []byte { p := v4(); p[ipv4HdrLen+16]++; return p }(), true, errMalformed},
		{"TCP payload changed", func() []byte { p := v4(); p[len(p)-1]++; return p }(), true, errMalformed},
		{"IPv6 TCP checksum wrong", func() []byte { p := v6(); p[ipv6HdrLen+16]++; return p }(), true, errMalformed},
		// The kernel says an offloaded checksum is not filled in yet: the
		// rest is still checked, the checksum not.
		{"TCP checksum not ready", func() []byte { p := v4(); p[ipv4HdrLen+16]++; return p }(), false, nil},
		{"Ethernet padding after the packet", append(v4(), 0, 0, 0, 0), true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.pkt, tc.verify)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if string(s.Payload[:6]) != "banner" || len(s.Payload) != 6 {
					t.Fatalf("payload %q, want %q", s.Payload, "banner")
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse = %v, %v; want %v", s.String(), err, tc.want)
			}
		})
	}
}
