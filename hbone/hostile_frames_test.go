package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Hostile peers that stall flow control, send malformed or abusive frames,
// or a bad preface; the rig is in hostile_test.go.

// TestHostileStalls: a peer that never opens its flow-control windows or
// stops reading altogether holds no more than the windows' worth of buffers,
// and its handler is released when the connection ends.
func TestHostileStalls(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		settings []http2.Setting
		// readTCP: the peer keeps reading frames (but never returns window).
		readTCP bool
		want    error // what the handler's Write finally fails with
	}{
		{
			name:     "zero stream window",
			settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}},
			readTCP:  true,
			want:     ErrConnClosed,
		},
		{
			name:     "connection window never returned",
			settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 1 << 30}},
			readTCP:  true,
			want:     ErrConnClosed,
		},
		{
			name: "peer stops reading: ping timeout",
			cfg:  Config{PingInterval: 100 * time.Millisecond, PingTimeout: 2 * time.Second},
			want: ErrConnClosed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrote := make(chan int64, 1)
			errc := make(chan error, 1)
			started := make(chan struct{})
			h := func(ctx context.Context, req *ServerRequest) {
				if req.Authority != hostileAuthority {
					echoHandler(ctx, req)
					return
				}
				s, err := req.Respond(http.StatusOK, nil)
				if err != nil {
					errc <- err
					return
				}
				defer s.Close()
				close(started)
				// A backend with endless data for the stalled client.
				chunk := make([]byte, 64<<10)
				var n int64
				for {
					if _, err := s.Write(chunk); err != nil {
						wrote <- n
						errc <- err
						return
					}
					n += int64(len(chunk))
				}
			}
			r := startHostile(t, tc.cfg, h)
			p := r.attacker(t, tc.settings...)
			stop := r.sample(t)
			p.connect(1, hostileAuthority)
			var data atomic.Int64
			readDone := make(chan struct{})
			if tc.readTCP {
				// Read and acknowledge PINGs, never send WINDOW_UPDATE; end
				// the connection once the windows are certainly exhausted.
				go func() {
					defer close(readDone)
					for {
						f, err := p.fr.ReadFrame()
						if err != nil {
							return
						}
						switch f := f.(type) {
						case *http2.DataFrame:
							data.Add(int64(len(f.Data())))
						case *http2.PingFrame:
							if !f.IsAck() {
								_ = p.fr.WritePing(true, f.Data)
							}
						}
					}
				}()
				// Stall for a while: the healthy connection works meanwhile.
				// (Closing before the server read the request would lose it.)
				<-started
				r.checkHealthy(t)
				r.checkHealthy(t)
				_ = p.nc.Close()
			} else {
				close(readDone)
			}
			var err error
			select {
			case err = <-errc:
			case <-testContext(t).Done():
				t.Fatal("the stalled handler was never released")
			}
			<-readDone
			if !errors.Is(err, tc.want) {
				t.Fatalf("stalled handler's Write: %v, want %v", err, tc.want)
			}
			n := <-wrote
			if tc.readTCP {
				// Only the windows' worth of data was taken from the handler;
				// the rest waited in the handler, not in the server.
				limit := int64(initialWindow)
				if got := data.Load(); got > limit {
					t.Errorf("peer received %d bytes with a window of %d", got, limit)
				}
				if n > limit+64<<10 {
					t.Errorf("handler wrote %d bytes into a window of %d", n, limit)
				}
			}
			if peak := stop(); peak > backlogBound(r.cfg) {
				t.Errorf("write backlog peaked at %d bytes, bound %d", peak, backlogBound(r.cfg))
			}
			r.serveErr(t)
			r.checkHealthy(t)
		})
	}
}

// TestHostileFrames: invalid frames and state transitions, each answered as
// RFC 9113 says: a connection error (GOAWAY with the code) or a stream error
// (RST_STREAM with the code, the connection staying up).
func TestHostileFrames(t *testing.T) {
	const rst, goaway = false, true
	for _, tc := range []struct {
		name string
		run  func(p *rawPeer)
		conn bool
		id   uint32 // the reset stream, for stream errors
		code http2.ErrCode
		rfc  string // the RFC 9113 section that decides the answer
	}{
		{"DATA on idle stream", func(p *rawPeer) { _ = p.fr.WriteData(3, false, []byte("x")) }, goaway, 0, http2.ErrCodeProtocol, "5.1 idle"},
		{"HEADERS on closed stream", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			p.expectStatus(1, "200")
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			p.connect(1, hostileAuthority)
		}, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"HEADERS reusing a lower stream ID", func(p *rawPeer) {
			p.connect(5, hostileAuthority)
			p.expectStatus(5, "200")
			p.connect(3, hostileAuthority)
		}, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"HEADERS on half-closed stream", func(p *rawPeer) {
			p.headers(1, true, ":method", "CONNECT", ":authority", hostileAuthority)
			p.expectStatus(1, "200")
			p.headers(1, true, "x-trailer", "1")
		}, rst, 1, http2.ErrCodeStreamClosed, "5.1 half-closed (remote)"},
		{"trailers and DATA after our RST_STREAM ignored", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			p.expectStatus(1, "200")
			_ = p.fr.WriteWindowUpdate(1, maxWindow) // overflows: the server resets the stream
			p.expectRST(1, http2.ErrCodeFlowControl)
			p.headers(1, true, "x-trailer", "1")
			_ = p.fr.WriteData(1, false, []byte("late"))
			p.connect(3, hostileAuthority)
			p.expectStatus(3, "200")
			_ = p.fr.WriteRSTStream(3, http2.ErrCodeCancel)
		}, rst, 0, 0, "5.1 closed: ignore frames after sending RST_STREAM"},
		{"HEADERS on stream 0", func(p *rawPeer) {
			_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 0, BlockFragment: []byte{0x82}, EndHeaders: true})
		}, goaway, 0, http2.ErrCodeProtocol, "6.2"},
		{"PRIORITY on stream 0", func(p *rawPeer) { _ = p.fr.WritePriority(0, http2.PriorityParam{Weight: 1}) }, goaway, 0, http2.ErrCodeProtocol, "6.3"},
		{"RST_STREAM on stream 0", func(p *rawPeer) { _ = p.fr.WriteRSTStream(0, http2.ErrCodeCancel) }, goaway, 0, http2.ErrCodeProtocol, "6.4"},
		{"CONTINUATION on stream 0", func(p *rawPeer) { _ = p.fr.WriteContinuation(0, true, []byte{0x82}) }, goaway, 0, http2.ErrCodeProtocol, "6.10"},
		{"DATA on stream 0", func(p *rawPeer) { _ = p.fr.WriteData(0, false, []byte("x")) }, goaway, 0, http2.ErrCodeProtocol, "6.1"},
		{"SETTINGS on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameSettings, 0, 1, nil) }, goaway, 0, http2.ErrCodeProtocol, "6.5"},
		{"PING on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FramePing, 0, 1, make([]byte, 8)) }, goaway, 0, http2.ErrCodeProtocol, "6.7"},
		{"GOAWAY on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameGoAway, 0, 1, make([]byte, 8)) }, goaway, 0, http2.ErrCodeProtocol, "6.8"},
		{"PING of 7 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FramePing, 0, 0, make([]byte, 7)) }, goaway, 0, http2.ErrCodeFrameSize, "6.7"},
		{"SETTINGS ACK with payload", func(p *rawPeer) {
			_ = p.fr.WriteRawFrame(http2.FrameSettings, http2.FlagSettingsAck, 0, make([]byte, 6))
		}, goaway, 0, http2.ErrCodeFrameSize, "6.5"},
		{"WINDOW_UPDATE of 3 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 0, make([]byte, 3)) }, goaway, 0, http2.ErrCodeFrameSize, "6.9"},
		{"RST_STREAM of 3 bytes", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			_ = p.fr.WriteRawFrame(http2.FrameRSTStream, 0, 1, make([]byte, 3))
		}, goaway, 0, http2.ErrCodeFrameSize, "6.4"},
		{"GOAWAY of 4 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameGoAway, 0, 0, make([]byte, 4)) }, goaway, 0, http2.ErrCodeFrameSize, "6.8"},
		{"frame above SETTINGS_MAX_FRAME_SIZE", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			// Only the header: the server must not wait for the payload.
			n := DefaultMaxFrameSize + 1
			_, _ = p.nc.Write([]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(http2.FrameData), 0, 0, 0, 0, 1})
		}, goaway, 0, http2.ErrCodeFrameSize, "4.2"},
		{"PRIORITY of 4 bytes on idle stream", func(p *rawPeer) {
			_ = p.fr.WriteRawFrame(http2.FramePriority, 0, 9, make([]byte, 4))
		}, rst, 9, http2.ErrCodeFrameSize, "6.3"},
		{"client opens even stream", func(p *rawPeer) { p.connect(2, hostileAuthority) }, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"SETTINGS_ENABLE_PUSH=2", nil, goaway, 0, http2.ErrCodeProtocol, "6.5.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHostile(t, Config{}, holdHandler)
			var settings []http2.Setting
			if tc.run == nil {
				settings = []http2.Setting{{ID: http2.SettingEnablePush, Val: 2}}
			}
			p := r.attacker(t, settings...)
			if tc.run != nil {
				tc.run(p)
			}
			t.Logf("RFC 9113 section %s", tc.rfc)
			switch {
			case tc.conn:
				p.expectGoAway(tc.code)
				if f := p.next(); f != nil {
					t.Fatalf("frame %v after GOAWAY", f.Header())
				}
				expectConnError(t, r.serveErr(t), tc.code)
			case tc.code != 0:
				p.expectRST(tc.id, tc.code)
				pingAlive(t, p)
			default:
				pingAlive(t, p)
			}
			r.checkHealthy(t)
		})
	}
}

// TestHostilePreface: a peer that does not speak HTTP/2 is dropped at once
// (RFC 9113 section 3.4 allows omitting the GOAWAY), without a handler.
func TestHostilePreface(t *testing.T) {
	for _, tc := range []struct {
		name string
		send string
	}{
		{"HTTP/1.1 request", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"truncated preface", http2.ClientPreface[:10]},
		{"preface with a wrong byte", strings.Replace(http2.ClientPreface, "SM", "SN", 1)},
		{"binary junk", string(bytes.Repeat([]byte{0xff}, 64))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHostile(t, Config{}, nil)
			nc, err := r.ts.dial(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_, _ = io.WriteString(nc, tc.send)
			if len(tc.send) < len(http2.ClientPreface) {
				_ = nc.(interface{ CloseWrite() error }).CloseWrite()
			}
			_ = nc.SetReadDeadline(time.Now().Add(testTimeout))
			_, _ = io.Copy(io.Discard, nc)
			err = r.serveErr(t)
			if !errors.Is(err, ErrBadPreface) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("ServeConn: %v, want a bad preface", err)
			}
			if n := r.attacked.Load(); n != 0 {
				t.Errorf("%d handlers ran", n)
			}
			r.checkHealthy(t)
		})
	}
}
