package hbone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// splitConn is a net.Conn whose reads return a fixed byte stream cut where
// the test says: each Read returns at most the next piece. Once the pieces
// are used up it returns io.EOF if eof, else blocks until Close. Writes are
// kept.
type splitConn struct {
	pieces [][]byte
	eof    bool
	closed chan struct{}
	once   sync.Once

	mu  sync.Mutex // guards the following fields
	out bytes.Buffer
}

func newSplitConn(stream []byte, cuts []int, eof bool) *splitConn {
	c := &splitConn{eof: eof, closed: make(chan struct{})}
	prev := 0
	for _, at := range cuts {
		if at > prev && at < len(stream) {
			c.pieces = append(c.pieces, stream[prev:at])
			prev = at
		}
	}
	c.pieces = append(c.pieces, stream[prev:])
	return c
}

func (c *splitConn) Read(p []byte) (int, error) {
	for len(c.pieces) > 0 && len(c.pieces[0]) == 0 {
		c.pieces = c.pieces[1:]
	}
	if len(c.pieces) == 0 {
		if c.eof {
			return 0, io.EOF
		}
		<-c.closed
		return 0, net.ErrClosed
	}
	n := copy(p, c.pieces[0])
	c.pieces[0] = c.pieces[0][n:]
	return n, nil
}

func (c *splitConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *splitConn) output() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

func (c *splitConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *splitConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 15008} }
func (c *splitConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 40000}
}
func (c *splitConn) SetDeadline(t time.Time) error      { return nil }
func (c *splitConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *splitConn) SetWriteDeadline(t time.Time) error { return nil }

// pumpResult is what a server connection made of a client's byte stream.
type pumpResult struct {
	Err     string            // ServeConn's error
	Streams map[uint32]string // what each handler read: bytes, then the error
	Frames  []string          // the server's frames, WINDOW_UPDATEs left out
}

// serveSplit runs a server connection over stream cut at cuts and reports
// what came of it. Handlers read their stream to its end without
// answering and return only once the connection is gone, so nothing they
// do reaches the wire.
func serveSplit(t *testing.T, stream []byte, cuts []int, eof bool) pumpResult {
	t.Helper()
	var mu sync.Mutex
	res := pumpResult{Streams: map[uint32]string{}}
	srv := NewServer(Config{PingInterval: -1, MaxHeaderBlockSize: 8 << 10}, func(ctx context.Context, req *ServerRequest) {
		b, err := io.ReadAll(req.s)
		mu.Lock()
		res.Streams[req.StreamID()] = streamResult(b, err)
		mu.Unlock()
		<-ctx.Done()
	})
	nc := newSplitConn(stream, cuts, eof)
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(context.Background(), nc) }()
	select {
	case err := <-done:
		if err != nil {
			res.Err = err.Error()
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ServeConn did not return")
	}
	if !eof {
		// The connection ended by itself (GOAWAY): its output is complete.
		res.Frames = summarizeFrames(t, nc.output())
	}
	return res
}

// streamResult is a short account of what a stream's reader got.
func streamResult(b []byte, err error) string {
	if len(b) > 64 {
		return fmt.Sprintf("%d bytes %q...%q then %v", len(b), b[:16], b[len(b)-16:], err)
	}
	return fmt.Sprintf("%q then %v", b, err)
}

// summarizeFrames lists the frames in out but WINDOW_UPDATEs, whose
// timing follows the handlers' reads.
func summarizeFrames(t *testing.T, out []byte) []string {
	t.Helper()
	fr := http2.NewFramer(nil, bytes.NewReader(out))
	fr.SetMaxReadFrameSize(maxMaxFrameSize)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var frames []string
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			return frames
		}
		if err != nil {
			t.Fatalf("server output: %v", err)
		}
		switch f := f.(type) {
		case *http2.WindowUpdateFrame:
		case *http2.GoAwayFrame:
			frames = append(frames, fmt.Sprintf("GOAWAY last=%d %v %q", f.LastStreamID, f.ErrCode, f.DebugData()))
		case *http2.RSTStreamFrame:
			frames = append(frames, fmt.Sprintf("RST_STREAM %d %v", f.StreamID, f.ErrCode))
		case *http2.MetaHeadersFrame:
			frames = append(frames, fmt.Sprintf("HEADERS %d %v", f.StreamID, f.Fields))
		default:
			frames = append(frames, fmt.Sprintf("%v", f.Header()))
		}
	}
}

// clientStream builds a client's byte stream: the preface, SETTINGS and
// what fn writes.
func clientStream(fn func(fr *http2.Framer, block func(kv ...string) []byte)) []byte {
	var buf, hbuf bytes.Buffer
	buf.WriteString(http2.ClientPreface)
	enc := hpack.NewEncoder(&hbuf)
	fr := http2.NewFramer(&buf, nil)
	fr.AllowIllegalWrites = true
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	fn(fr, func(kv ...string) []byte {
		hbuf.Reset()
		for i := 0; i < len(kv); i += 2 {
			_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return bytes.Clone(hbuf.Bytes())
	})
	return buf.Bytes()
}

// pumpConnect is a CONNECT request's header fields.
var pumpConnect = []string{":method", "CONNECT", ":authority", "10.0.0.1:80"}

// endWithError is a frame every valid test stream ends with: a
// connection error (WINDOW_UPDATE of 0 on the connection), so that the
// server ends the connection by GOAWAY after every frame before it.
func endWithError(fr *http2.Framer) { _ = fr.WriteWindowUpdate(0, 0) }

// pumpCases are byte streams for the split test, with what a whole read of
// each must give.
func pumpCases() []struct {
	name    string
	stream  []byte
	eof     bool
	streams map[uint32]string // expected handler results (nil: not checked)
	goAway  string            // expected substring of the frames
	err     string            // expected substring of ServeConn's error
} {
	big := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80,000 bytes: more than a large buffer
	return []struct {
		name    string
		stream  []byte
		eof     bool
		streams map[uint32]string
		goAway  string
		err     string
	}{
		{
			name: "streams",
			stream: clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(pumpConnect...), EndHeaders: true})
				_ = fr.WriteData(1, false, []byte("hello "))
				_ = fr.WriteDataPadded(1, false, []byte("padded "), make([]byte, 20))
				_ = fr.WriteData(1, false, nil)
				// A header block in three pieces, interleaved with nothing.
				b := block(append(pumpConnect, "baggage", "k=v")...)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: b[:3]})
				_ = fr.WriteContinuation(3, false, b[3:7])
				_ = fr.WriteContinuation(3, true, b[7:])
				_ = fr.WriteData(1, false, big)
				_ = fr.WritePing(false, [8]byte{1, 2, 3})
				_ = fr.WritePriority(3, http2.PriorityParam{StreamDep: 1, Weight: 3})
				_ = fr.WriteRawFrame(0xfa, 0, 0, big[:70000]) // unknown type, whole in a buffer of its own
				_ = fr.WriteData(3, true, []byte("three"))
				_ = fr.WriteDataPadded(1, true, []byte("world"), make([]byte, 255))
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: block(pumpConnect...), EndHeaders: true})
				_ = fr.WriteRSTStream(5, http2.ErrCodeCancel)
				_ = fr.WriteData(5, false, []byte("after reset")) // STREAM_CLOSED: the client reset it
				_ = fr.WritePriority(7, http2.PriorityParam{StreamDep: 7})
				_ = fr.WriteRawFrame(http2.FramePriority, 0, 9, []byte{1, 2})
				_ = fr.WriteRawFrame(http2.FramePriority, 0, 11, nil)
				_ = fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
				endWithError(fr)
			}),
			streams: map[uint32]string{
				1: streamResult([]byte("hello padded "+string(big)+"world"), nil),
				3: `"three" then <nil>`,
				5: `"" then hbone: stream reset by peer: CANCEL`,
			},
			goAway: `GOAWAY last=5 PROTOCOL_ERROR "malformed frame"`,
			err:    "malformed frame",
		},
		{
			name: "header block too large",
			stream: clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(pumpConnect...)})
				for range 1000 {
					_ = fr.WriteContinuation(1, false, nil)
				}
			}),
			goAway: `GOAWAY last=0 ENHANCE_YOUR_CALM "header block on stream 1 exceeds 8192 bytes"`,
			err:    "header block on stream 1 exceeds 8192 bytes",
		},
		{
			name: "continuation interrupted",
			stream: clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				b := block(pumpConnect...)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:2]})
				_ = fr.WriteContinuation(1, false, b[2:4])
				_ = fr.WriteData(1, false, []byte("x"))
			}),
			goAway: `PROTOCOL_ERROR "got DATA for stream 1; expected CONTINUATION following CONTINUATION for stream 1"`,
			err:    "got DATA for stream 1",
		},
		{
			name: "frame too large",
			stream: clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				_ = fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, DefaultMaxFrameSize+1))
			}),
			goAway: `FRAME_SIZE_ERROR "DATA frame of 1048577 bytes exceeds 1048576"`,
			err:    "DATA frame of 1048577 bytes exceeds 1048576",
		},
		{
			name: "padding beyond the frame",
			stream: clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(pumpConnect...), EndHeaders: true})
				_ = fr.WriteRawFrame(http2.FrameData, http2.FlagDataPadded, 1, []byte{9, 'a', 'b'})
			}),
			streams: map[uint32]string{1: `"" then hbone: connection closed: hbone: protocol error PROTOCOL_ERROR: DATA padding of 9 bytes in a 3-byte frame`},
			goAway:  `GOAWAY last=1 PROTOCOL_ERROR "DATA padding of 9 bytes in a 3-byte frame"`,
			err:     "DATA padding",
		},
		{
			name:   "bad preface",
			stream: []byte("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + strings.Repeat("x", 100)),
			eof:    true,
			err:    ErrBadPreface.Error(),
		},
		{
			name: "truncated data",
			stream: truncated(clientStream(func(fr *http2.Framer, block func(...string) []byte) {
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(pumpConnect...), EndHeaders: true})
				_ = fr.WriteData(1, false, []byte("complete"))
				_ = fr.WriteDataPadded(1, false, big[:5000], make([]byte, 10))
			}), 9+1+5000+10, 9+1+4000),
			eof:     true,
			streams: map[uint32]string{1: streamResult([]byte("complete"+string(big[:4000])), errors.New("hbone: connection closed: hbone: read: EOF"))},
		},
	}
}

// truncated cuts stream's last frame, of size bytes, to its first keep.
func truncated(stream []byte, size, keep int) []byte { return stream[:len(stream)-size+keep] }

// TestPumpSplits feeds each byte stream to a server connection whole, one
// byte per read and in random cuts: the pump must make the same of it
// whatever the cuts (streams' bytes and errors, the frames sent back, the
// connection's error).
func TestPumpSplits(t *testing.T) {
	for _, tc := range pumpCases() {
		t.Run(tc.name, func(t *testing.T) {
			whole := serveSplit(t, tc.stream, nil, tc.eof)
			if tc.streams != nil && !reflect.DeepEqual(whole.Streams, tc.streams) {
				t.Errorf("streams:\n got %v\nwant %v", whole.Streams, tc.streams)
			}
			if got := strings.Join(whole.Frames, "\n"); !strings.Contains(got, tc.goAway) {
				t.Errorf("frames do not contain %q:\n%s", tc.goAway, got)
			}
			if !strings.Contains(whole.Err, tc.err) || (tc.err == "") != (whole.Err == "") {
				t.Errorf("error %q, want %q", whole.Err, tc.err)
			}
			splits := map[string][]int{"bytes": nil}
			for i := range len(tc.stream) {
				splits["bytes"] = append(splits["bytes"], i+1)
			}
			for seed := range uint64(4) {
				r := rand.New(rand.NewPCG(seed, 23))
				var cuts []int
				for at := 0; at < len(tc.stream); {
					at += 1 + r.IntN([]int{16, 300, 5000, 70000}[seed])
					cuts = append(cuts, at)
				}
				splits[fmt.Sprintf("random%d", seed)] = cuts
			}
			for name, cuts := range splits {
				if got := serveSplit(t, tc.stream, cuts, tc.eof); !reflect.DeepEqual(got, whole) {
					t.Errorf("%s: got\n%+v\nwant (whole)\n%+v", name, got, whole)
				}
			}
		})
	}
}

// TestPumpReleasesBuffer: once the pump has processed every byte it holds,
// the connection holds no read buffer; a partial frame keeps one, and says
// how many bytes it needs.
func TestPumpReleasesBuffer(t *testing.T) {
	c := newConn(newSplitConn(nil, nil, true), Config{PingInterval: -1}.withDefaults(false), false)
	var buf bytes.Buffer
	buf.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&buf, nil)
	_ = fr.WriteSettings()
	_ = fr.WritePing(false, [8]byte{7})
	_ = fr.WritePing(false, [8]byte{8})
	in := buf.Bytes()
	for _, tc := range []struct {
		name     string
		feed     []byte
		held     bool
		need     int
		wantSize int
	}{
		{"preface and frames", in[:len(in)-3], true, 8, inSmallSize},
		{"the rest", in[len(in)-3:], false, frameHeaderLen, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c.in.buf == nil {
				c.in.buf = getInBuf(inSmallSize)
			}
			c.in.w += copy(c.in.buf.b[c.in.w:], tc.feed)
			for {
				progress, err := c.step()
				if err != nil {
					t.Fatal(err)
				}
				if !progress {
					break
				}
			}
			if (c.in.buf != nil) != tc.held {
				t.Fatalf("read buffer held: %v, want %v", c.in.buf != nil, tc.held)
			}
			if tc.held && len(c.in.buf.b) != tc.wantSize {
				t.Errorf("read buffer of %d bytes, want %d", len(c.in.buf.b), tc.wantSize)
			}
			if c.in.need != tc.need {
				t.Errorf("pump needs %d bytes, want %d", c.in.need, tc.need)
			}
		})
	}
}
