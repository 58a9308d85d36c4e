package hbone

import (
	"errors"
	"testing"

	"golang.org/x/net/http2"
)

// TestServerStreamStates: frames on streams that are not open, on real
// frames over a real connection, and the answer RFC 9113 section 5.1 gives
// each (a connection error, a stream error, or nothing at all). Streams the
// client skipped are never opened (section 5.1.1); a stream the client
// ended or reset itself cannot receive more DATA or HEADERS from it; frames
// that may have crossed our RST_STREAM are ignored.
func TestServerStreamStates(t *testing.T) {
	const (
		quiet  = iota // no answer: no RST_STREAM on the stream, no GOAWAY
		rst           // RST_STREAM(code) on the stream, connection alive
		goaway        // GOAWAY(code)
	)
	for _, tc := range []struct {
		name   string
		rfc    string
		run    func(p *rawPeer)
		answer int
		id     uint32 // the stream the answer is about
		code   http2.ErrCode
	}{
		// Identifiers the client skipped (stream 3, after it opened 5).
		{"HEADERS with END_STREAM on a skipped lower stream", "5.1.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			p.expectStatus(5, "200")
			p.headers(3, true, ":method", "CONNECT", ":authority", "a:1")
		}, goaway, 0, http2.ErrCodeProtocol},
		{"trailers-shaped HEADERS on a skipped stream", "5.1.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			p.headers(3, true, "x-trailer", "1")
		}, goaway, 0, http2.ErrCodeProtocol},
		{"HEADERS on a skipped stream after a GET", "5.1.1", func(p *rawPeer) {
			p.headers(5, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
			p.headers(3, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
		}, goaway, 0, http2.ErrCodeProtocol},
		{"DATA on a skipped stream", "5.1.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			_ = p.fr.WriteData(3, false, []byte("x"))
		}, goaway, 0, http2.ErrCodeProtocol},
		{"WINDOW_UPDATE on a skipped stream", "5.1.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			_ = p.fr.WriteWindowUpdate(3, 1)
		}, goaway, 0, http2.ErrCodeProtocol},
		{"RST_STREAM on a skipped stream", "5.1.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			_ = p.fr.WriteRSTStream(3, http2.ErrCodeCancel)
		}, goaway, 0, http2.ErrCodeProtocol},
		{"PRIORITY on a skipped stream", "5.1", func(p *rawPeer) {
			p.connect(5, "a:1")
			_ = p.fr.WritePriority(3, http2.PriorityParam{StreamDep: 5, Weight: 1})
		}, quiet, 3, 0},
		{"streams skipped in order", "5.1.1", func(p *rawPeer) {
			p.connect(3, "a:1") // skips 1
			p.connect(9, "a:1") // skips 5 and 7
			p.connect(11, "a:1")
			p.expectStatus(11, "200")
			_ = p.fr.WriteData(7, false, []byte("x"))
		}, goaway, 0, http2.ErrCodeProtocol},

		// Idle streams.
		{"PRIORITY on an idle stream", "5.1 idle", func(p *rawPeer) {
			_ = p.fr.WritePriority(7, http2.PriorityParam{Weight: 1})
		}, quiet, 7, 0},
		{"PRIORITY depending on itself", "RFC 7540 5.3.1", func(p *rawPeer) {
			_ = p.fr.WritePriority(7, http2.PriorityParam{StreamDep: 7, Weight: 1})
		}, rst, 7, http2.ErrCodeProtocol},
		{"HEADERS depending on itself", "RFC 7540 5.3.1", func(p *rawPeer) {
			p.hbuf.Reset()
			_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.headerBlock(":method", "CONNECT", ":authority", "a:1"),
				EndHeaders: true, Priority: http2.PriorityParam{StreamDep: 1, Weight: 1}})
		}, rst, 1, http2.ErrCodeProtocol},

		// Closed by END_STREAM both ways.
		{"DATA on a stream closed both ways", "5.1 closed", func(p *rawPeer) {
			closeBoth(p, 1)
			_ = p.fr.WriteData(1, false, []byte("late"))
		}, rst, 1, http2.ErrCodeStreamClosed},
		{"trailers on a stream closed both ways", "5.1 closed", func(p *rawPeer) {
			closeBoth(p, 1)
			p.headers(1, true, "x-trailer", "1")
		}, goaway, 0, http2.ErrCodeStreamClosed},
		{"HEADERS without END_STREAM on a closed stream", "5.1.1", func(p *rawPeer) {
			closeBoth(p, 1)
			p.connect(1, "a:1")
		}, goaway, 0, http2.ErrCodeProtocol},
		{"CONTINUATION on a closed stream", "6.10", func(p *rawPeer) {
			closeBoth(p, 1)
			_ = p.fr.WriteContinuation(1, true, p.headerBlock("x-trailer", "1"))
		}, goaway, 0, http2.ErrCodeProtocol},
		{"WINDOW_UPDATE on a stream closed both ways", "5.1 closed", func(p *rawPeer) {
			closeBoth(p, 1)
			_ = p.fr.WriteWindowUpdate(1, 1)
		}, quiet, 1, 0},
		{"RST_STREAM on a stream closed both ways", "5.1 closed", func(p *rawPeer) {
			closeBoth(p, 1)
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		}, quiet, 1, 0},
		{"PRIORITY on a stream closed both ways", "5.1 closed", func(p *rawPeer) {
			closeBoth(p, 1)
			_ = p.fr.WritePriority(1, http2.PriorityParam{Weight: 1})
		}, quiet, 1, 0},
		{"DATA after a request answered at its HEADERS", "5.1 half-closed (remote)", func(p *rawPeer) {
			p.headers(1, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
			p.expectStatus(1, "400")
			_ = p.fr.WriteData(1, true, []byte("late"))
		}, rst, 1, http2.ErrCodeStreamClosed},
		{"DATA on a closed stream older than the history", "5.1 closed (MAY)", func(p *rawPeer) {
			for id := uint32(1); id <= 2*closedRingLen+1; id += 2 {
				closeBoth(p, id)
			}
			_ = p.fr.WriteData(1, false, []byte("late")) // forgotten: ignored as if it crossed a reset
		}, quiet, 1, 0},

		// Reset by the client.
		{"DATA after the client's RST_STREAM", "5.1 closed", func(p *rawPeer) {
			p.connect(1, "a:1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = p.fr.WriteData(1, false, []byte("late"))
		}, rst, 1, http2.ErrCodeStreamClosed},
		{"trailers after the client's RST_STREAM", "5.1 closed", func(p *rawPeer) {
			p.connect(1, "a:1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			p.headers(1, true, "x-trailer", "1")
		}, rst, 1, http2.ErrCodeStreamClosed},
		{"DATA after the client reset a request we had reset", "5.1 closed", func(p *rawPeer) {
			p.headers(1, false, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
			p.expectRST(1, http2.ErrCodeNo) // after the 400
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = p.fr.WriteData(1, false, []byte("late"))
		}, rst, 1, http2.ErrCodeStreamClosed},
		{"WINDOW_UPDATE after the client's RST_STREAM", "5.1 closed", func(p *rawPeer) {
			p.connect(1, "a:1")
			p.expectStatus(1, "200")
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = p.fr.WriteWindowUpdate(1, 1)
		}, quiet, 1, 0},

		// Reset by us: what the client sent before it saw the reset.
		{"DATA and trailers after our RST_STREAM", "5.1 closed", func(p *rawPeer) {
			serverReset(p, 1)
			_ = p.fr.WriteData(1, false, []byte("crossed"))
			p.headers(1, true, "x-trailer", "1")
		}, quiet, 1, 0},
		{"DATA after our early response", "8.1", func(p *rawPeer) {
			p.headers(1, false, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
			p.expectRST(1, http2.ErrCodeNo)
			_ = p.fr.WriteData(1, true, []byte("crossed"))
		}, quiet, 1, 0},

		// Malformed requests other than CONNECT (section 8.3.1).
		{"GET without :path", "8.3.1", func(p *rawPeer) {
			p.headers(1, true, ":method", "GET", ":scheme", "https", ":authority", "a:1")
		}, rst, 1, http2.ErrCodeProtocol},
		{"GET with an empty :path", "8.3.1", func(p *rawPeer) {
			p.headers(1, true, ":method", "GET", ":scheme", "https", ":path", "", ":authority", "a:1")
		}, rst, 1, http2.ErrCodeProtocol},
		{"POST without :scheme", "8.3.1", func(p *rawPeer) {
			p.headers(1, false, ":method", "POST", ":path", "/", ":authority", "a:1")
		}, rst, 1, http2.ErrCodeProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{}, echoHandler, false)
			p := dialRaw(t, ts)
			tc.run(p)
			t.Logf("RFC 9113 section %s", tc.rfc)
			switch tc.answer {
			case goaway:
				p.expectGoAway(tc.code)
				var ce *ConnError
				if err := <-ts.serveErrs; !errors.As(err, &ce) || ce.Code != tc.code {
					t.Fatalf("ServeConn: %v, want ConnError %v", err, tc.code)
				}
			case rst:
				p.expectRST(tc.id, tc.code)
				expectQuiet(t, p, tc.id)
			default:
				expectQuiet(t, p, tc.id)
			}
			// A new stream still works on a connection that lives on.
			if tc.answer != goaway {
				p.connect(101, "a:1")
				p.expectStatus(101, "200")
			}
		})
	}
}

// closeBoth opens stream id, ends it and waits for the server's end of it:
// the stream is closed both ways.
func closeBoth(p *rawPeer, id uint32) {
	p.t.Helper()
	p.connect(id, "a:1")
	p.expectStatus(id, "200")
	if err := p.fr.WriteData(id, true, nil); err != nil {
		p.t.Fatal(err)
	}
	for {
		switch f := p.next().(type) {
		case nil:
			p.t.Fatalf("connection closed before stream %d ended", id)
		case *http2.DataFrame:
			if f.StreamID == id && f.StreamEnded() {
				return
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				p.t.Fatalf("RST_STREAM %v on stream %d, want END_STREAM", f.ErrCode, id)
			}
		}
	}
}

// serverReset opens stream id and makes the server reset it (a window
// overflow, RFC 9113 section 6.9.1).
func serverReset(p *rawPeer, id uint32) {
	p.t.Helper()
	p.connect(id, "a:1")
	p.expectStatus(id, "200")
	_ = p.fr.WriteWindowUpdate(id, maxWindow)
	p.expectRST(id, http2.ErrCodeFlowControl)
}

// expectQuiet pings the server and fails on a GOAWAY, or a RST_STREAM on
// stream id, before the answer.
func expectQuiet(t *testing.T, p *rawPeer, id uint32) {
	t.Helper()
	data := [8]byte{'q', 'u', 'i', 'e', 't'}
	if err := p.fr.WritePing(false, data); err != nil {
		t.Fatalf("PING: %v", err)
	}
	for {
		switch f := p.next().(type) {
		case nil:
			t.Fatal("connection closed; want it alive")
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v; want the connection alive", f.ErrCode)
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				t.Fatalf("RST_STREAM %v on stream %d; want no answer", f.ErrCode, id)
			}
		case *http2.PingFrame:
			if f.IsAck() && f.Data == data {
				return
			}
		}
	}
}
