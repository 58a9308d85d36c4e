package hbone

import (
	"context"
	"io"
	"net/http"
	"slices"
	"testing"

	"golang.org/x/net/http2"
)

// TestH2SpecExcused proves the reason docs/h2spec.md gives for each h2spec
// case it excuses. Most of them need what only a CONNECT stream has here:
// h2spec's requests are GETs and POSTs, which a CONNECT-only server answers
// 400 at their HEADERS, with no content and the stream closed, so a case
// that needs a response body to flow-control, or a stream that stays open,
// finds neither. Each such case is replayed frame for frame with a CONNECT
// request in place of h2spec's, and must then get the answer h2spec wants.
func TestH2SpecExcused(t *testing.T) {
	proofs := map[string]func(t *testing.T){
		// Flow control of what the server sends: a CONNECT stream whose
		// handler has bytes to send stands in for h2spec's response body.
		"generic/2/2": func(t *testing.T) {
			p := dialBody(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteWindowUpdate(1, 1) // on a half-closed (remote) stream
			p.expectData(1, h2specBody[:1])
		},
		"generic/2/3": func(t *testing.T) {
			p := dialBody(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.expectStatus(1, "200")
			_ = p.fr.WritePriority(1, http2.PriorityParam{Weight: 255}) // on a half-closed (remote) stream
			_ = p.fr.WriteWindowUpdate(1, 1)
			p.expectData(1, h2specBody[:1])
		},
		"http2/6.5.3/1": func(t *testing.T) {
			p := dialBody(t)
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.expectData(1, h2specBody[:1]) // the last value counts
		},
		"http2/6.9.1/1": func(t *testing.T) {
			p := dialBody(t)
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.expectData(1, h2specBody[:1])
		},
		"http2/6.9.2/1": func(t *testing.T) {
			p := dialBody(t)
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
			p.expectData(1, h2specBody[:1])
		},
		"http2/6.9.2/2": func(t *testing.T) {
			p := dialBody(t)
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3})
			p.headers(1, true, ":method", "CONNECT", ":authority", "a:1")
			p.expectData(1, h2specBody[:3])
			p.settings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 2}) // window 3-3 -> -1
			_ = p.fr.WriteWindowUpdate(1, 2)                                      // -> 1
			p.expectData(1, h2specBody[3:4])
		},
		// Streams that stay open: a CONNECT tunnel does.
		"http2/5.1.2/1": func(t *testing.T) {
			p := dialBody(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			id := uint32(1)
			for range DefaultServerMaxStreams + 1 {
				p.headers(id, true, ":method", "CONNECT", ":authority", "a:1")
				id += 2
			}
			p.expectRST(id-2, http2.ErrCodeRefusedStream)
		},
		"http2/6.9.1/3": func(t *testing.T) {
			ts := startServer(t, Config{}, echoHandler, false)
			p := dialRaw(t, ts)
			p.connect(1, "a:1")
			_ = p.fr.WriteWindowUpdate(1, maxWindow)
			_ = p.fr.WriteWindowUpdate(1, maxWindow)
			p.expectRST(1, http2.ErrCodeFlowControl)
		},
		// content-length: DATA on a CONNECT stream is no content but the
		// tunnel's bytes, carried whole whatever the header says.
		"http2/8.1.2.6/1": func(t *testing.T) {
			ts := startServer(t, Config{}, echoHandler, false)
			p := dialRaw(t, ts)
			p.headers(1, false, ":method", "CONNECT", ":authority", "a:1", "content-length", "1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteData(1, true, []byte("test"))
			if got := p.readUntilEnd(1); got != "test" {
				t.Fatalf("tunnel carried %q, want %q", got, "test")
			}
		},
		"http2/8.1.2.6/2": func(t *testing.T) {
			ts := startServer(t, Config{}, echoHandler, false)
			p := dialRaw(t, ts)
			p.headers(1, false, ":method", "CONNECT", ":authority", "a:1", "content-length", "1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteData(1, false, []byte("test"))
			_ = p.fr.WriteData(1, true, []byte("test"))
			if got := p.readUntilEnd(1); got != "testtest" {
				t.Fatalf("tunnel carried %q, want %q", got, "testtest")
			}
		},
		// The case assumes SETTINGS_MAX_FRAME_SIZE 16384; with the server
		// advertising that, h2spec's own case passes.
		"http2/4.2/3": func(t *testing.T) {
			bin := buildH2Spec(t)
			tg := startH2SpecTarget(t, Config{MaxFrameSize: minMaxFrameSize}, echoHandler)
			results := tg.run(t, bin, "http2/4.2/3")
			if len(results) != 1 || results[0].ID != "http2/4.2/3" || results[0].Result != "passed" {
				t.Fatalf("h2spec http2/4.2/3 with SETTINGS_MAX_FRAME_SIZE %d: %+v", minMaxFrameSize, results)
			}
		},
	}
	excused := excusedH2SpecCases(t)
	for _, id := range excused {
		if proofs[id] == nil {
			t.Errorf("docs/h2spec.md excuses %s without a proof here", id)
		}
	}
	for id, proof := range proofs {
		if !slices.Contains(excused, id) {
			t.Errorf("a proof for %s, which docs/h2spec.md does not excuse", id)
			continue
		}
		t.Run(id, proof)
	}
}

// h2specBody is what bodyHandler sends on every stream: more than the
// small windows the flow-control cases open.
const h2specBody = "a tunnel's first bytes, sent as the windows allow"

// bodyHandler answers 200 and sends h2specBody, then ends the stream.
func bodyHandler(_ context.Context, req *ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	go func() {
		defer s.Close()
		if _, err := io.WriteString(s, h2specBody); err == nil {
			_ = s.CloseWrite()
		}
	}()
}

// dialBody connects a raw client to a server running bodyHandler, with
// settings in its first SETTINGS frame.
func dialBody(t *testing.T, settings ...http2.Setting) *rawPeer {
	t.Helper()
	return dialRaw(t, startServer(t, Config{}, bodyHandler, false), settings...)
}

// settings sends SETTINGS and waits for the server's acknowledgement.
func (p *rawPeer) settings(s ...http2.Setting) {
	p.t.Helper()
	if err := p.fr.WriteSettings(s...); err != nil {
		p.t.Fatal(err)
	}
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			p.t.Fatalf("waiting for SETTINGS ACK: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok {
			if sf.IsAck() {
				return
			}
			_ = p.fr.WriteSettingsAck()
		}
	}
}

// expectData reads until a DATA frame on stream id and checks that it
// carries want: no more than the window allowed.
func (p *rawPeer) expectData(id uint32, want string) {
	p.t.Helper()
	for {
		switch f := p.next().(type) {
		case nil:
			p.t.Fatalf("connection closed before DATA on stream %d", id)
		case *http2.DataFrame:
			if f.StreamID == id {
				if string(f.Data()) != want {
					p.t.Fatalf("DATA %q on stream %d, want %q (what the window allows)", f.Data(), id, want)
				}
				return
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				p.t.Fatalf("RST_STREAM %v on stream %d, want DATA", f.ErrCode, id)
			}
		case *http2.GoAwayFrame:
			p.t.Fatalf("GOAWAY %v, want DATA on stream %d", f.ErrCode, id)
		}
	}
}

// readUntilEnd collects the DATA of stream id up to its END_STREAM.
func (p *rawPeer) readUntilEnd(id uint32) string {
	p.t.Helper()
	var got []byte
	for {
		switch f := p.next().(type) {
		case nil:
			p.t.Fatalf("connection closed before stream %d ended", id)
		case *http2.DataFrame:
			if f.StreamID == id {
				got = append(got, f.Data()...)
				if f.StreamEnded() {
					return string(got)
				}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				p.t.Fatalf("RST_STREAM %v on stream %d after %q", f.ErrCode, id, got)
			}
		case *http2.GoAwayFrame:
			p.t.Fatalf("GOAWAY %v before stream %d ended", f.ErrCode, id)
		}
	}
}
