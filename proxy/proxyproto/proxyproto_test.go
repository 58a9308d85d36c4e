package proxyproto

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func mustEncode(t testing.TB, h *Header) []byte {
	t.Helper()
	b, err := h.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func equalHeaders(a, b *Header) bool {
	if a.Command != b.Command || a.Src != b.Src || a.Dst != b.Dst || len(a.TLVs) != len(b.TLVs) {
		return false
	}
	for i := range a.TLVs {
		if a.TLVs[i].Type != b.TLVs[i].Type || !bytes.Equal(a.TLVs[i].Value, b.TLVs[i].Value) {
			return false
		}
	}
	return true
}

func TestEncode(t *testing.T) {
	sig := signature[:]
	tests := []struct {
		name string
		h    Header
		want []byte
	}{
		{
			name: "proxy ipv4 with spiffe tlv",
			h: Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:8080"),
				TLVs: []TLV{{TypeSPIFFEID, []byte("spiffe://td/ns/a/sa/b")}}},
			want: cat(sig, []byte{0x21, 0x11, 0, 12 + 3 + 21}, []byte{10, 0, 0, 1, 10, 0, 0, 2, 0x9c, 0x40, 0x1f, 0x90},
				[]byte{0xD0, 0, 21}, []byte("spiffe://td/ns/a/sa/b")),
		},
		{
			name: "proxy ipv6",
			h:    Header{Command: Proxy, Src: netip.MustParseAddrPort("[fd00::1]:1"), Dst: netip.MustParseAddrPort("[fd00::2]:2")},
			want: cat(sig, []byte{0x21, 0x21, 0, 36}, netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("fd00::2").AsSlice(), []byte{0, 1, 0, 2}),
		},
		{
			name: "mixed families as ipv6",
			h:    Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("[fd00::2]:2")},
			want: cat(sig, []byte{0x21, 0x21, 0, 36}, netip.MustParseAddr("::ffff:10.0.0.1").AsSlice(), netip.MustParseAddr("fd00::2").AsSlice(), []byte{0, 1, 0, 2}),
		},
		{
			name: "v4-mapped both sides as ipv4",
			h:    Header{Command: Proxy, Src: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"), Dst: netip.MustParseAddrPort("[::ffff:10.0.0.2]:2")},
			want: cat(sig, []byte{0x21, 0x11, 0, 12}, []byte{10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2}),
		},
		{
			name: "local without addresses",
			h:    Header{Command: Local},
			want: cat(sig, []byte{0x20, 0x00, 0, 0}),
		},
		{
			name: "local with a tlv",
			h:    Header{Command: Local, TLVs: []TLV{{0x04, nil}}},
			want: cat(sig, []byte{0x20, 0x00, 0, 3, 0x04, 0, 0}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mustEncode(t, &tc.h)
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got  % x\nwant % x", got, tc.want)
			}
		})
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		h    Header
	}{
		{"only source", Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1")}},
		{"bad command", Header{Command: 7}},
		{"tlv too long", Header{Command: Local, TLVs: []TLV{{1, make([]byte, 0x10000)}}}},
		{"body too long", Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.1:1"),
			TLVs: []TLV{{1, make([]byte, 0xFFF1)}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if b, err := tc.h.AppendBinary(nil); err == nil {
				t.Fatalf("encoded % x, want an error", b[:min(len(b), 32)])
			}
		})
	}
}

func TestParse(t *testing.T) {
	sig := signature[:]
	v4 := []byte{10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2}
	tests := []struct {
		name    string
		in      []byte
		want    *Header
		wantN   int
		wantErr error
	}{
		{
			name: "ipv4 with trailing data", in: cat(sig, []byte{0x21, 0x11, 0, 12}, v4, []byte("GET /")),
			want:  &Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:2")},
			wantN: 28,
		},
		{
			name: "tlvs", in: cat(sig, []byte{0x21, 0x11, 0, 12 + 4 + 3}, v4, []byte{0xD0, 0, 1, 'x', 0xD1, 0, 0}),
			want: &Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:2"),
				TLVs: []TLV{{0xD0, []byte("x")}, {0xD1, nil}}},
			wantN: 35,
		},
		{
			name: "proxy with unspec family", in: cat(sig, []byte{0x21, 0x00, 0, 0}),
			want: &Header{Command: Proxy}, wantN: 16,
		},
		{name: "not proxy protocol", in: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), wantErr: ErrNotProxy},
		{name: "v1 text header", in: []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), wantErr: ErrNotProxy},
		{name: "short prefix", in: sig[:5], wantErr: io.ErrUnexpectedEOF},
		{name: "short body", in: cat(sig, []byte{0x21, 0x11, 0, 12}, v4[:4]), wantErr: io.ErrUnexpectedEOF},
		{name: "version 1 byte", in: cat(sig, []byte{0x11, 0x11, 0, 12}, v4), wantErr: ErrInvalid},
		{name: "command 2", in: cat(sig, []byte{0x22, 0x11, 0, 12}, v4), wantErr: ErrInvalid},
		{name: "udp", in: cat(sig, []byte{0x21, 0x12, 0, 12}, v4), wantErr: ErrUnsupported},
		{name: "unix stream", in: cat(sig, []byte{0x21, 0x31, 0, 0}), wantErr: ErrUnsupported},
		{name: "unknown family", in: cat(sig, []byte{0x21, 0x41, 0, 0}), wantErr: ErrInvalid},
		{name: "length shorter than ipv4 block", in: cat(sig, []byte{0x21, 0x11, 0, 8}, v4[:8]), wantErr: ErrInvalid},
		{name: "length shorter than ipv6 block", in: cat(sig, []byte{0x21, 0x21, 0, 12}, v4), wantErr: ErrInvalid},
		{name: "tlv overruns body", in: cat(sig, []byte{0x21, 0x11, 0, 12 + 4}, v4, []byte{0xD0, 0, 9, 'x'}), wantErr: ErrInvalid},
		{name: "tlv header cut", in: cat(sig, []byte{0x21, 0x11, 0, 12 + 2}, v4, []byte{0xD0, 0}), wantErr: ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, n, err := Parse(tc.in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.wantN || !equalHeaders(h, tc.want) {
				t.Fatalf("got %+v (%d bytes), want %+v (%d bytes)", h, n, tc.want, tc.wantN)
			}
			// Read agrees with Parse and leaves the rest unread.
			r := bytes.NewReader(tc.in)
			rh, err := Read(r)
			if err != nil || !equalHeaders(rh, h) || r.Len() != len(tc.in)-n {
				t.Fatalf("Read: %+v, %v, %d left; want %+v, %d left", rh, err, r.Len(), h, len(tc.in)-n)
			}
		})
	}
}

func TestReadRejectsBeforeBody(t *testing.T) {
	// A bad version is refused before the announced 64 KiB body is awaited.
	in := cat(signature[:], []byte{0x31, 0x11, 0xFF, 0xFF})
	if _, err := Read(bytes.NewReader(in)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

// randomHeader builds a valid header; addresses are normalized the way a
// round trip normalizes them (v4-mapped addresses unmapped).
func randomHeader(r *rand.Rand) *Header {
	h := &Header{Command: Command(r.IntN(2))}
	addr := func(v6 bool) netip.Addr {
		if v6 {
			var a [16]byte
			for i := range a {
				a[i] = byte(r.Uint32())
			}
			return netip.AddrFrom16(a).Unmap()
		}
		var a [4]byte
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		return netip.AddrFrom4(a)
	}
	if r.IntN(4) != 0 {
		h.Src = netip.AddrPortFrom(addr(r.IntN(2) == 0), uint16(r.Uint32()))
		h.Dst = netip.AddrPortFrom(addr(r.IntN(2) == 0), uint16(r.Uint32()))
	}
	for range r.IntN(4) {
		v := make([]byte, r.IntN(300))
		for i := range v {
			v[i] = byte(r.Uint32())
		}
		h.TLVs = append(h.TLVs, TLV{Type: byte(r.Uint32()), Value: v})
	}
	return h
}

func TestRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		h := randomHeader(r)
		b := mustEncode(t, h)
		got, n, err := Parse(append(b, "payload"...))
		if err != nil || n != len(b) || !equalHeaders(got, h) {
			t.Fatalf("case %d: %+v encoded as % x parsed as %+v (%d bytes), %v", i, h, b, got, n, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(mustEncode(f, &Header{Command: Proxy, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:2"),
		TLVs: []TLV{{TypeSPIFFEID, []byte("spiffe://cluster.local/ns/default/sa/client")}}}))
	f.Add(mustEncode(f, &Header{Command: Proxy, Src: netip.MustParseAddrPort("[fd00::1]:1"), Dst: netip.MustParseAddrPort("[fd00::2]:2")}))
	f.Add(mustEncode(f, &Header{Command: Local}))
	f.Add([]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, n, err := Parse(in)
		rh, rerr := Read(bytes.NewReader(in))
		if (err == nil) != (rerr == nil) {
			t.Fatalf("Parse and Read disagree: %v vs %v", err, rerr)
		}
		if err != nil {
			return
		}
		if n < fixedLen || n > len(in) || !equalHeaders(h, rh) {
			t.Fatalf("consumed %d of %d; Parse %+v, Read %+v", n, len(in), h, rh)
		}
		// What parsed re-encodes to a header that parses the same.
		b, err := h.AppendBinary(nil)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", h, err)
		}
		again, m, err := Parse(b)
		if err != nil || m != len(b) || !equalHeaders(again, h) {
			t.Fatalf("re-parsed %+v, %v; want %+v", again, err, h)
		}
	})
}
