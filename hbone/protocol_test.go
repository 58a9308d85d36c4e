package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// holdHandler answers 200 and keeps the stream, unread, until the
// connection ends.
func holdHandler(ctx context.Context, req *ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	go func() {
		<-ctx.Done()
		s.Close()
	}()
}

func TestServerAutoResponses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields []string
		status string
	}{
		{"GET", []string{":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1"}, "400"},
		{"POST", []string{":method", "POST", ":scheme", "https", ":path", "/x", ":authority", "a:1"}, "400"},
		{"empty authority", []string{":method", "CONNECT", ":authority", ""}, "400"},
		{"missing authority", []string{":method", "CONNECT"}, "400"},
		// Found by FuzzParseRequest: the client refused to send these but
		// the server passed them to its handler.
		{"authority with space", []string{":method", "CONNECT", ":authority", " 0"}, "400"},
		{"authority with slash", []string{":method", "CONNECT", ":authority", "10.0.0.1:80/x"}, "400"},
		{"extended CONNECT", []string{":method", "CONNECT", ":protocol", "websocket", ":scheme", "https", ":path", "/", ":authority", "a:1"}, "400"},
		{"CONNECT with path", []string{":method", "CONNECT", ":authority", "a:1", ":path", "/"}, "400"},
		{"header list too large", []string{":method", "CONNECT", ":authority", "a:1",
			"a", strings.Repeat("a", 300), "b", strings.Repeat("b", 300), "c", strings.Repeat("c", 300), "d", strings.Repeat("d", 300)}, "431"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := make(chan struct{}, 1)
			ts := startServer(t, Config{MaxHeaderListSize: 1024}, func(_ context.Context, req *ServerRequest) {
				called <- struct{}{}
				_, _ = req.Respond(http.StatusOK, nil)
			}, false)
			p := dialRaw(t, ts)
			p.headers(1, false, tc.fields...)
			f := p.expectStatus(1, tc.status)
			if !f.StreamEnded() {
				t.Error("response does not end the stream")
			}
			p.expectRST(1, http2.ErrCodeNo)
			// The connection stays usable.
			p.connect(3, "a:1")
			p.expectStatus(3, "200")
			<-called
			select {
			case <-called:
				t.Error("handler called for the rejected request")
			default:
			}
		})
	}
}

func TestServerStreamErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		run  func(p *rawPeer)
		id   uint32
		code http2.ErrCode
	}{
		{
			name: "connection-specific header",
			run: func(p *rawPeer) {
				p.headers(1, false, ":method", "CONNECT", ":authority", "a:1", "connection", "keep-alive")
			},
			id: 1, code: http2.ErrCodeProtocol,
		},
		{
			name: "uppercase header name",
			run: func(p *rawPeer) {
				p.headers(1, false, ":method", "CONNECT", ":authority", "a:1", "Baggage", "x")
			},
			id: 1, code: http2.ErrCodeProtocol,
		},
		{
			name: "stream window overflow",
			cfg:  Config{StreamWindow: 65535},
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WriteData(1, false, make([]byte, 65536))
			},
			id: 1, code: http2.ErrCodeFlowControl,
		},
		{
			name: "DATA after END_STREAM",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WriteData(1, true, []byte("bye"))
				_ = p.fr.WriteData(1, false, []byte("more"))
			},
			id: 1, code: http2.ErrCodeStreamClosed,
		},
		{
			name: "concurrent stream limit",
			cfg:  Config{MaxStreams: 1},
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				p.expectStatus(1, "200")
				p.connect(3, "a:1")
			},
			id: 3, code: http2.ErrCodeRefusedStream,
		},
		{
			name: "stream window update overflow",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				p.expectStatus(1, "200")
				_ = p.fr.WriteWindowUpdate(1, maxWindow)
			},
			id: 1, code: http2.ErrCodeFlowControl,
		},
		{
			name: "zero window increment",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				p.expectStatus(1, "200")
				_ = p.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 1, []byte{0, 0, 0, 0})
			},
			id: 1, code: http2.ErrCodeProtocol,
		},
		{
			name: "trailers without END_STREAM",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				p.headers(1, false, "x-trailer", "1")
			},
			id: 1, code: http2.ErrCodeProtocol,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, tc.cfg, holdHandler, false)
			p := dialRaw(t, ts)
			tc.run(p)
			p.expectRST(tc.id, tc.code)
			// Stream errors leave the connection usable.
			_ = p.fr.WritePing(false, [8]byte{1, 2, 3})
			for {
				f := p.next()
				if f == nil {
					t.Fatal("connection closed after a stream error")
				}
				if _, ok := f.(*http2.GoAwayFrame); ok {
					t.Fatal("GOAWAY after a stream error")
				}
				if ping, ok := f.(*http2.PingFrame); ok && ping.IsAck() {
					break
				}
			}
		})
	}
}

func TestServerConnErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		settings []http2.Setting
		run      func(p *rawPeer)
		code     http2.ErrCode
	}{
		{
			name: "DATA on idle stream",
			run:  func(p *rawPeer) { _ = p.fr.WriteData(5, false, []byte("x")) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "DATA on stream 0",
			run: func(p *rawPeer) {
				p.fr.AllowIllegalWrites = true
				_ = p.fr.WriteData(0, false, []byte("x"))
			},
			code: http2.ErrCodeProtocol,
		},
		{
			name: "frame larger than max frame size",
			cfg:  Config{MaxFrameSize: 16384},
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WriteData(1, false, make([]byte, 16385))
			},
			code: http2.ErrCodeFrameSize,
		},
		{
			name: "connection window overflow",
			cfg:  Config{StreamWindow: 1 << 20, ConnWindow: 65535},
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WriteData(1, false, make([]byte, 65536))
			},
			code: http2.ErrCodeFlowControl,
		},
		{
			name: "padding longer than payload",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WriteRawFrame(http2.FrameData, http2.FlagDataPadded, 1, []byte{5, 'a', 'b'})
			},
			code: http2.ErrCodeProtocol,
		},
		{
			name: "even stream ID",
			run:  func(p *rawPeer) { p.connect(2, "a:1") },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "RST_STREAM on idle stream",
			run:  func(p *rawPeer) { _ = p.fr.WriteRSTStream(7, http2.ErrCodeCancel) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "WINDOW_UPDATE on idle stream",
			run:  func(p *rawPeer) { _ = p.fr.WriteWindowUpdate(9, 100) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "connection window update overflow",
			run:  func(p *rawPeer) { _ = p.fr.WriteWindowUpdate(0, maxWindow) },
			code: http2.ErrCodeFlowControl,
		},
		{
			name: "zero window increment on idle stream",
			run:  func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 11, []byte{0, 0, 0, 0}) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "zero connection window increment",
			run:  func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 0, []byte{0, 0, 0, 0}) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "CONTINUATION without HEADERS",
			run:  func(p *rawPeer) { _ = p.fr.WriteContinuation(1, true, []byte{0x82}) },
			code: http2.ErrCodeProtocol,
		},
		{
			name: "HEADERS interrupted",
			run: func(p *rawPeer) {
				_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}})
				_ = p.fr.WriteData(1, false, []byte("x"))
			},
			code: http2.ErrCodeProtocol,
		},
		{
			name: "PUSH_PROMISE from client",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				_ = p.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
			},
			code: http2.ErrCodeProtocol,
		},
		{
			name:     "initial window size too large",
			settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 1 << 31}},
			run:      func(*rawPeer) {},
			code:     http2.ErrCodeFlowControl,
		},
		{
			name:     "max frame size too small",
			settings: []http2.Setting{{ID: http2.SettingMaxFrameSize, Val: 100}},
			run:      func(*rawPeer) {},
			code:     http2.ErrCodeProtocol,
		},
		{
			name: "SETTINGS window change overflows a stream",
			run: func(p *rawPeer) {
				p.connect(1, "a:1")
				p.expectStatus(1, "200")
				_ = p.fr.WriteWindowUpdate(1, maxWindow-initialWindow)
				_ = p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: initialWindow + 1})
			},
			code: http2.ErrCodeFlowControl,
		},
		{
			name: "bad HPACK",
			run: func(p *rawPeer) {
				_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
			},
			code: http2.ErrCodeCompression,
		},
		{
			name: "SETTINGS with a bad length",
			run:  func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameSettings, 0, 0, []byte{0, 1, 0}) },
			code: http2.ErrCodeFrameSize,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, tc.cfg, holdHandler, false)
			p := dialRaw(t, ts, tc.settings...)
			tc.run(p)
			p.expectGoAway(tc.code)
			if f := p.next(); f != nil {
				t.Fatalf("frame %v after GOAWAY", f.Header())
			}
			var ce *ConnError
			if err := <-ts.serveErrs; !errors.As(err, &ce) || ce.Code != tc.code {
				t.Fatalf("ServeConn: %v, want ConnError %v", err, tc.code)
			}
		})
	}
}

// TestRapidReset: streams reset right after opening free their slot, but
// their handlers are still capped.
func TestRapidReset(t *testing.T) {
	release := make(chan struct{})
	ts := startServer(t, Config{MaxStreams: 2}, func(context.Context, *ServerRequest) {
		<-release // a handler slow to notice the reset
	}, false)
	defer close(release)
	p := dialRaw(t, ts)
	for id := uint32(1); id <= 7; id += 2 {
		p.connect(id, "a:1")
		_ = p.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	p.connect(9, "a:1")
	p.expectRST(9, http2.ErrCodeRefusedStream)
}

func TestFirstFrameNotSettings(t *testing.T) {
	ts := startServer(t, Config{}, holdHandler, false)
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p := &rawPeer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	_, _ = io.WriteString(nc, http2.ClientPreface)
	_ = p.fr.WritePing(false, [8]byte{})
	p.expectGoAway(http2.ErrCodeProtocol)
}

func TestPingAck(t *testing.T) {
	ts := startServer(t, Config{}, holdHandler, false)
	p := dialRaw(t, ts)
	data := [8]byte{8, 7, 6, 5, 4, 3, 2, 1}
	_ = p.fr.WritePing(false, data)
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if ping, ok := f.(*http2.PingFrame); ok {
			if !ping.IsAck() || ping.Data != data {
				t.Fatalf("PING %v ack=%v, want ack of %v", ping.Data, ping.IsAck(), data)
			}
			return
		}
	}
}

// TestPingTimeout: a peer that never acknowledges PINGs is cut off.
func TestPingTimeout(t *testing.T) {
	ts := startServer(t, Config{PingInterval: 10e6, PingTimeout: 30e6}, holdHandler, false)
	p := dialRaw(t, ts)
	sawPing := false
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			break // closed by the server
		}
		if ping, ok := f.(*http2.PingFrame); ok && !ping.IsAck() {
			sawPing = true
		}
	}
	if !sawPing {
		t.Error("no PING before the close")
	}
	if err := <-ts.serveErrs; err != errPingTimeout {
		t.Fatalf("ServeConn: %v, want ping timeout", err)
	}
}

// TestKeepalive: a peer that acknowledges PINGs stays connected.
func TestKeepalive(t *testing.T) {
	ts := startServer(t, Config{PingInterval: 5e6, PingTimeout: 20e6}, holdHandler, false)
	p := dialRaw(t, ts)
	acks := 0
	for acks < 5 {
		f, err := p.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if ping, ok := f.(*http2.PingFrame); ok && !ping.IsAck() {
			_ = p.fr.WritePing(true, ping.Data)
			acks++
		}
	}
}

// TestDataOnResetStreamIgnored: DATA racing with our RST_STREAM is dropped
// and its connection window returned.
func TestDataOnResetStreamIgnored(t *testing.T) {
	ts := startServer(t, Config{ConnWindow: 65535, StreamWindow: 65535}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		_ = s.Reset(http2.ErrCodeCancel)
	}, false)
	p := dialRaw(t, ts)
	p.connect(1, "a:1")
	p.expectStatus(1, "200")
	p.expectRST(1, http2.ErrCodeCancel)
	// Twice the connection window: fails unless the window comes back.
	for range 8 {
		if err := p.fr.WriteData(1, false, make([]byte, 16384)); err != nil {
			t.Fatal(err)
		}
	}
	p.connect(3, "a:1")
	p.expectStatus(3, "200")
}

// TestPaddedData: padding is stripped and its window returned.
func TestPaddedData(t *testing.T) {
	got := make(chan string, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		defer s.Close()
		b, _ := io.ReadAll(s)
		got <- string(b)
	}, false)
	p := dialRaw(t, ts)
	p.connect(1, "a:1")
	_ = p.fr.WriteDataPadded(1, false, []byte("hello "), make([]byte, 200))
	_ = p.fr.WriteDataPadded(1, true, []byte("world"), []byte{})
	if s := <-got; s != "hello world" {
		t.Fatalf("read %q", s)
	}
}

// TestContinuation: a request header block split over CONTINUATION frames.
func TestContinuation(t *testing.T) {
	got := make(chan string, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		got <- req.Header.Get("Baggage")
		_, _ = req.Respond(http.StatusOK, nil)
	}, false)
	p := dialRaw(t, ts)
	big := strings.Repeat("k=v,", 5000)
	p.hbuf.Reset()
	for _, kv := range [][2]string{{":method", "CONNECT"}, {":authority", "a:1"}, {"baggage", big}} {
		_ = p.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	block := p.hbuf.Bytes()
	_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:100]})
	_ = p.fr.WriteContinuation(1, false, block[100:9000])
	_ = p.fr.WriteContinuation(1, true, block[9000:])
	p.expectStatus(1, "200")
	if b := <-got; b != big {
		t.Fatalf("baggage of %d bytes, want %d", len(b), len(big))
	}
}

// TestWindowUpdateBatching checks WINDOW_UPDATEs are sent per half window
// consumed, not per read.
func TestWindowUpdateBatching(t *testing.T) {
	const total = 6 << 20
	done := make(chan struct{})
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		defer close(done)
		defer s.Close()
		buf := make([]byte, 1000) // many small reads
		for {
			if _, err := s.Read(buf); err != nil {
				return
			}
		}
	}, false)
	p := dialRaw(t, ts)
	p.connect(1, "a:1")
	window := int64(initialWindow) // until the server's SETTINGS arrive
	connWindow := int64(initialWindow)
	sent := 0
	var streamUpdates, connUpdates []uint32
	for sent < total {
		n := int(min(16384, window, connWindow, int64(total-sent)))
		if n > 0 {
			if err := p.fr.WriteData(1, false, make([]byte, n)); err != nil {
				t.Fatal(err)
			}
			sent += n
			window -= int64(n)
			connWindow -= int64(n)
			continue
		}
		f, err := p.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				window += int64(v) - initialWindow
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connUpdates = append(connUpdates, f.Increment)
				connWindow += int64(f.Increment)
			} else {
				streamUpdates = append(streamUpdates, f.Increment)
				window += int64(f.Increment)
			}
		}
	}
	_ = p.fr.WriteData(1, true, nil)
	<-done
	if len(connUpdates) == 0 || connUpdates[0] != DefaultConnWindow-initialWindow {
		t.Fatalf("connection window updates %v: want the initial enlargement first", connUpdates)
	}
	for _, inc := range connUpdates[1:] {
		if inc < DefaultConnWindow/2 {
			t.Errorf("connection WINDOW_UPDATE of %d, want at least half the window", inc)
		}
	}
	if len(streamUpdates) == 0 {
		t.Fatal("no stream WINDOW_UPDATE")
	}
	for _, inc := range streamUpdates {
		if inc < DefaultStreamWindow/2 {
			t.Errorf("stream WINDOW_UPDATE of %d, want at least half the window", inc)
		}
	}
}

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
