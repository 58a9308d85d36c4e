package hbone

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The client against a misbehaving server (rawServer).

// TestClientRejectsBadServer drives our client against a hand-written
// server that breaks rules.
func TestClientRejectsBadServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(p *rawPeer, id uint32) // after the CONNECT HEADERS arrived
		check func(t *testing.T, err error, cc *ClientConn)
	}{
		{
			name: "DATA before response",
			serve: func(p *rawPeer, id uint32) {
				_ = p.fr.WriteData(id, false, []byte("x"))
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				var se *StreamError
				if !errors.As(err, &se) || se.Code != http2.ErrCodeProtocol || !se.Local {
					t.Fatalf("Connect: %v, want local PROTOCOL_ERROR reset", err)
				}
			},
		},
		{
			name: "missing status",
			serve: func(p *rawPeer, id uint32) {
				p.headers(id, false, "baggage", "x")
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				var se *StreamError
				if !errors.As(err, &se) || se.Code != http2.ErrCodeProtocol {
					t.Fatalf("Connect: %v, want PROTOCOL_ERROR reset", err)
				}
			},
		},
		{
			name: "interim 100 then 200",
			serve: func(p *rawPeer, id uint32) {
				p.headers(id, false, ":status", "100")
				p.headers(id, false, ":status", "200")
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
			},
		},
		{
			name: "refused stream",
			serve: func(p *rawPeer, id uint32) {
				_ = p.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("Connect: %v, want ErrRefused", err)
				}
			},
		},
		{
			name: "GOAWAY below the stream",
			serve: func(p *rawPeer, _ uint32) {
				// Last stream ID 0: stream 1 was not processed.
				_ = p.fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			},
			check: func(t *testing.T, err error, cc *ClientConn) {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("Connect: %v, want ErrRefused", err)
				}
				if cc.CanTakeNewStream() {
					t.Error("CanTakeNewStream after GOAWAY")
				}
			},
		},
		{
			name: "GOAWAY with error",
			serve: func(p *rawPeer, id uint32) {
				_ = p.fr.WriteGoAway(id, http2.ErrCodeEnhanceYourCalm, []byte("slow down"))
				_ = p.nc.Close()
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				var ga *GoAwayError
				if !errors.As(err, &ga) || ga.Code != http2.ErrCodeEnhanceYourCalm || ga.DebugData != "slow down" {
					t.Fatalf("Connect: %v, want GoAwayError", err)
				}
				if !errors.Is(err, ErrConnClosed) {
					t.Errorf("%v does not match ErrConnClosed", err)
				}
			},
		},
		{
			name: "push promise",
			serve: func(p *rawPeer, id uint32) {
				_ = p.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
			},
			check: func(t *testing.T, err error, _ *ClientConn) {
				var ce *ConnError
				if !errors.As(err, &ce) || ce.Code != http2.ErrCodeProtocol {
					t.Fatalf("Connect: %v, want ConnError PROTOCOL_ERROR", err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, p := rawServer(t)
			errc := make(chan error, 1)
			go func() {
				s, err := cc.Connect(testContext(t), &Request{Authority: "a:1"})
				if s != nil {
					s.Close()
				}
				errc <- err
			}()
			var id uint32
			for id == 0 {
				f := p.next()
				if f == nil {
					t.Fatal("client closed")
				}
				if h, ok := f.(*http2.MetaHeadersFrame); ok {
					id = h.StreamID
				}
			}
			tc.serve(p, id)
			tc.check(t, <-errc, cc)
		})
	}
}

// rawServer connects our ClientConn over loopback TCP to a hand-driven
// server peer that has sent its SETTINGS.
func rawServer(t *testing.T) (*ClientConn, *rawPeer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	_ = b.SetDeadline(time.Now().Add(testTimeout))
	cc, err := NewClientConn(a, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	p := &rawPeer{t: t, nc: b, fr: http2.NewFramer(b, b)}
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.enc = hpack.NewEncoder(&p.hbuf)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(b, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("client preface %q, %v", preface, err)
	}
	if err := p.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return cc, p
}
