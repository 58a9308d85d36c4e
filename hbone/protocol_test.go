package hbone

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http2"
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
