package socks5

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// conn is a scripted client: reads come from in, writes go to out.
type conn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *conn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *conn) Write(p []byte) (int, error) { return c.out.Write(p) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

var (
	greetNoAuth = []byte{5, 1, 0}
	okChoice    = []byte{5, 0}
)

func TestHandshake(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    Target
		wantErr error  // matched with errors.Is; nil = success
		wantOut []byte // everything the server wrote
		rest    int    // bytes the client sent that must stay unread
	}{
		{
			name: "ipv4 connect",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 1, 10, 0, 0, 1, 0x1f, 0x90}),
			want: Target{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Port: 8080}, wantOut: okChoice,
		},
		{
			name: "ipv6 connect",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 4}, netip.MustParseAddr("fd00::7").AsSlice(), []byte{0, 80}),
			want: Target{Addr: netip.MustParseAddrPort("[fd00::7]:80"), Port: 80}, wantOut: okChoice,
		},
		{
			name: "v4-mapped ipv6 is ipv4",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 4}, netip.MustParseAddr("::ffff:10.1.2.3").AsSlice(), []byte{0, 80}),
			want: Target{Addr: netip.MustParseAddrPort("10.1.2.3:80"), Port: 80}, wantOut: okChoice,
		},
		{
			name: "domain connect",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 3, 11}, []byte("echo.ns.svc"), []byte{0, 80}),
			want: Target{Host: "echo.ns.svc", Port: 80}, wantOut: okChoice,
		},
		{
			name: "ip literal as domain",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 3, 8}, []byte("10.0.0.9"), []byte{0, 81}),
			want: Target{Addr: netip.MustParseAddrPort("10.0.0.9:81"), Port: 81}, wantOut: okChoice,
		},
		{
			name: "no-auth among several methods",
			in:   cat([]byte{5, 3, 2, 1, 0}, []byte{5, 1, 0, 1, 1, 2, 3, 4, 0, 1}),
			want: Target{Addr: netip.MustParseAddrPort("1.2.3.4:1"), Port: 1}, wantOut: okChoice,
		},
		{
			name: "early data stays unread",
			in:   cat(greetNoAuth, []byte{5, 1, 0, 1, 10, 0, 0, 1, 0, 80}, []byte("GET / HTTP/1.1\r\n")),
			want: Target{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Port: 80}, wantOut: okChoice, rest: 16,
		},
		{
			name: "socks4 greeting", in: []byte{4, 1, 0, 80, 10, 0, 0, 1, 0},
			wantErr: ErrVersion, rest: 7,
		},
		{
			name: "username/password only", in: []byte{5, 1, 2},
			wantErr: ErrNoAcceptableMethod, wantOut: []byte{5, 0xff},
		},
		{
			name: "empty method list", in: []byte{5, 0},
			wantErr: ErrMalformed,
		},
		{
			name:    "bind refused",
			in:      cat(greetNoAuth, []byte{5, CmdBind, 0, 1, 10, 0, 0, 1, 0, 80}),
			wantErr: ErrCommand, wantOut: cat(okChoice, []byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0}),
		},
		{
			name:    "udp associate refused",
			in:      cat(greetNoAuth, []byte{5, CmdUDPAssociate, 0, 1, 0, 0, 0, 0, 0, 0}),
			wantErr: ErrCommand, wantOut: cat(okChoice, []byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0}),
		},
		{
			name:    "unknown address type",
			in:      cat(greetNoAuth, []byte{5, 1, 0, 9, 1, 2, 3, 4}),
			wantErr: ErrAddressType, wantOut: cat(okChoice, []byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0}), rest: 4,
		},
		{
			name:    "reserved byte set",
			in:      cat(greetNoAuth, []byte{5, 1, 1, 1, 10, 0, 0, 1, 0, 80}),
			wantErr: ErrMalformed, wantOut: cat(okChoice, []byte{5, 1, 0, 1, 0, 0, 0, 0, 0, 0}), rest: 6,
		},
		{
			name:    "empty domain",
			in:      cat(greetNoAuth, []byte{5, 1, 0, 3, 0, 0, 80}),
			wantErr: ErrMalformed, wantOut: cat(okChoice, []byte{5, 1, 0, 1, 0, 0, 0, 0, 0, 0}),
		},
		{
			name:    "control byte in domain",
			in:      cat(greetNoAuth, []byte{5, 1, 0, 3, 3, 'a', 0, 'b', 0, 80}),
			wantErr: ErrMalformed, wantOut: cat(okChoice, []byte{5, 1, 0, 1, 0, 0, 0, 0, 0, 0}),
		},
		{
			name:    "port zero",
			in:      cat(greetNoAuth, []byte{5, 1, 0, 1, 10, 0, 0, 1, 0, 0}),
			wantErr: ErrMalformed, wantOut: cat(okChoice, []byte{5, 1, 0, 1, 0, 0, 0, 0, 0, 0}),
		},
		{
			name:    "truncated domain",
			in:      cat(greetNoAuth, []byte{5, 1, 0, 3, 200, 'a', 'b'}),
			wantErr: io.ErrUnexpectedEOF, wantOut: okChoice,
		},
		{
			name: "truncated greeting", in: []byte{5},
			wantErr: io.ErrUnexpectedEOF,
		},
		{
			name: "nothing sent", in: nil,
			wantErr: io.EOF,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &conn{in: bytes.NewReader(tc.in)}
			got, err := Handshake(c)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tc.want {
				t.Errorf("target %+v, want %+v", got, tc.want)
			}
			if !bytes.Equal(c.out.Bytes(), tc.wantOut) {
				t.Errorf("server wrote % x, want % x", c.out.Bytes(), tc.wantOut)
			}
			if c.in.Len() != tc.rest {
				t.Errorf("%d bytes left unread, want %d", c.in.Len(), tc.rest)
			}
		})
	}
}

func TestWriteReply(t *testing.T) {
	tests := []struct {
		name string
		rep  Reply
		bnd  netip.AddrPort
		want []byte
	}{
		{"zero address", ReplySucceeded, netip.AddrPort{}, []byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}},
		{"ipv4", ReplyHostUnreachable, netip.MustParseAddrPort("10.0.0.1:258"), []byte{5, 4, 0, 1, 10, 0, 0, 1, 1, 2}},
		{"ipv6", ReplySucceeded, netip.MustParseAddrPort("[::1]:80"), cat([]byte{5, 0, 0, 4}, netip.IPv6Loopback().AsSlice(), []byte{0, 80})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteReply(&b, tc.rep, tc.bnd); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Bytes(), tc.want) {
				t.Fatalf("got % x, want % x", b.Bytes(), tc.want)
			}
		})
	}
}

// pipeConn joins a client and a server end with two buffers, for the
// client/server round trip (the server has already scripted its replies).
type pipeConn struct {
	r io.Reader
	w io.Writer
}

func (p pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }

func TestClientServerRoundTrip(t *testing.T) {
	targets := []struct {
		name string
		t    Target
	}{
		{"ipv4", Target{Addr: netip.MustParseAddrPort("10.9.8.7:443"), Port: 443}},
		{"ipv6", Target{Addr: netip.MustParseAddrPort("[fd00::1]:80"), Port: 80}},
		{"domain", Target{Host: "svc.ns.svc.cluster.local", Port: 8080}},
		{"longest domain", Target{Host: strings.Repeat("a", 255), Port: 1}},
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			// The client writes everything before reading, so run it against
			// a server script first, then the server against the client's bytes.
			var toServer bytes.Buffer
			script := cat(okChoice, []byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
			rep, err := ClientHandshake(pipeConn{bytes.NewReader(script), &toServer}, tc.t)
			if err != nil || rep != ReplySucceeded {
				t.Fatalf("client: %v, %v", rep, err)
			}
			c := &conn{in: bytes.NewReader(toServer.Bytes())}
			got, err := Handshake(c)
			if err != nil || got != tc.t {
				t.Fatalf("server parsed %+v, %v; want %+v", got, err, tc.t)
			}
		})
	}
}

func TestClientSeesFailureReply(t *testing.T) {
	var sink bytes.Buffer
	script := cat(okChoice, []byte{5, byte(ReplyConnectionRefused), 0, 1, 0, 0, 0, 0, 0, 0})
	rep, err := ClientHandshake(pipeConn{bytes.NewReader(script), &sink}, Target{Host: "x", Port: 1})
	if err == nil || rep != ReplyConnectionRefused {
		t.Fatalf("got %v, %v; want connection refused", rep, err)
	}
}

func FuzzHandshake(f *testing.F) {
	f.Add(cat(greetNoAuth, []byte{5, 1, 0, 1, 10, 0, 0, 1, 0x1f, 0x90}))
	f.Add(cat(greetNoAuth, []byte{5, 1, 0, 3, 3}, []byte("a.b"), []byte{0, 80}))
	f.Add(cat(greetNoAuth, []byte{5, 1, 0, 4}, make([]byte, 18)))
	f.Add([]byte{5, 2, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &conn{in: bytes.NewReader(in)}
		got, err := Handshake(c)
		out := c.out.Bytes()
		if len(out) > 2+22 {
			t.Fatalf("server wrote %d bytes", len(out))
		}
		if len(out) >= 2 && (out[0] != Version || (out[1] != MethodNoAuth && out[1] != MethodNoAcceptable)) {
			t.Fatalf("bad method choice % x", out[:2])
		}
		if err != nil {
			if got != (Target{}) {
				t.Fatalf("error %v with target %+v", err, got)
			}
			return
		}
		// Success: exactly the method choice was written, and the target
		// is usable and round-trips through the request encoder.
		if !bytes.Equal(out, okChoice) {
			t.Fatalf("success but server wrote % x", out)
		}
		if got.Port == 0 || (got.IsDomain() && got.Host == "") {
			t.Fatalf("unusable target %+v", got)
		}
		req, err := AppendRequest(nil, CmdConnect, got)
		if err != nil {
			t.Fatal(err)
		}
		again, rep, err := ReadRequest(bytes.NewReader(req))
		if err != nil || rep != ReplySucceeded || again != got {
			t.Fatalf("re-encoded request parsed as %+v, %v, %v; want %+v", again, rep, err, got)
		}
	})
}
