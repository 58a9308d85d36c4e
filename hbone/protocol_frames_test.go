package hbone

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Protocol rules for PING (acknowledgement, keepalive, timeout) and for
// DATA, padding, CONTINUATION and WINDOW_UPDATE batching, checked with a
// raw peer.

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
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{PingInterval: 10e6, PingTimeout: 30e6}, holdHandler, overPipe)
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
	})
}

// TestKeepalive: a peer that acknowledges PINGs stays connected.
func TestKeepalive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{PingInterval: 5e6, PingTimeout: 20e6}, holdHandler, overPipe)
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
	})
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
