package hbone

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// fuzzSeeds are frame sequences a client might send after its preface.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	build := func(fn func(fr *http2.Framer, block func(kv ...string) []byte)) {
		var buf, hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		block := func(kv ...string) []byte {
			hbuf.Reset()
			for i := 0; i < len(kv); i += 2 {
				_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
			}
			return append([]byte(nil), hbuf.Bytes()...)
		}
		fn(fr, block)
		seeds = append(seeds, buf.Bytes())
	}
	connect := func(kv ...string) []string {
		return append([]string{":method", "CONNECT", ":authority", "10.0.0.1:80"}, kv...)
	}
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(connect("baggage", "a=b")...), EndHeaders: true})
		_ = fr.WriteData(1, false, []byte("hello"))
		_ = fr.WriteWindowUpdate(1, 1000)
		_ = fr.WriteData(1, true, []byte("world"))
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings()
		b := block(connect("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")...)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:5]})
		_ = fr.WriteContinuation(1, true, b[5:])
		_ = fr.WriteDataPadded(1, false, []byte("x"), make([]byte, 10))
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block(":method", "GET", ":path", "/", ":scheme", "http")})
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 16384})
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(connect()...), EndHeaders: true, EndStream: true})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block(connect()...), EndHeaders: true})
		_ = fr.WriteWindowUpdate(0, 1<<20)
		_ = fr.WritePriority(3, http2.PriorityParam{StreamDep: 1, Weight: 8})
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		_ = fr.WriteSettingsAck()
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings()
		_ = fr.WriteData(1, false, []byte("idle"))
	})
	// Stream history (history.go): skipped identifiers, frames on streams
	// closed each way, self-dependencies, more closings than the ring holds.
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings()
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: block(connect()...), EndHeaders: true, EndStream: true})
		_ = fr.WritePriority(3, http2.PriorityParam{StreamDep: 3, Weight: 1})
		_ = fr.WriteData(5, false, []byte("late"))
		_ = fr.WriteRSTStream(5, http2.ErrCodeCancel)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block(connect()...), EndHeaders: true, EndStream: true})
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		_ = fr.WriteSettings()
		for id := uint32(1); id < 2*closedRingLen+8; id += 2 {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1"),
				EndHeaders: true, EndStream: id%4 == 1, Priority: http2.PriorityParam{StreamDep: id % 7, Weight: 1}})
			_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
			_ = fr.WriteData(id, id%3 == 0, []byte("x"))
		}
		_ = fr.WriteWindowUpdate(1, 1)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("x-trailer", "1"), EndHeaders: true, EndStream: true})
	})
	return seeds
}

// FuzzServerConn feeds arbitrary bytes, after a valid preface, into a server
// connection: it must neither panic nor hang, and must end every goroutine.
func FuzzServerConn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		srv := NewServer(Config{
			StreamWindow: 65535, ConnWindow: 65535, MaxFrameSize: 16384,
			MaxStreams: 4, MaxHeaderListSize: 4096, PingInterval: -1,
		}, func(_ context.Context, req *ServerRequest) {
			s, err := req.Respond(http.StatusOK, http.Header{"Baggage": {"x=y"}})
			if err != nil {
				return
			}
			echoStream(s, nil)
		})
		a, b := net.Pipe()
		served := make(chan error, 1)
		go func() { served <- srv.ServeConn(context.Background(), a) }()
		drained := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, b)
			close(drained)
		}()
		_ = b.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = b.Write([]byte(http2.ClientPreface))
		_, _ = b.Write(data)
		_ = b.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the peer closed")
		}
		select {
		case <-drained:
		case <-time.After(10 * time.Second):
			t.Fatal("server output did not end")
		}
		_ = srv.Close()
	})
}

// FuzzClientConn feeds arbitrary bytes, after a valid SETTINGS frame, from a
// server into a client connection with a CONNECT outstanding: it must
// neither panic nor hang, and must end every goroutine.
func FuzzClientConn(f *testing.F) {
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for _, kv := range [][2]string{{":status", "200"}, {"baggage", "k8s.cluster.name=c"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, false, []byte("banner"))
	_ = fr.WriteWindowUpdate(1, 1000)
	_ = fr.WritePing(false, [8]byte{})
	_ = fr.WriteData(1, true, nil)
	_ = fr.WriteGoAway(1, http2.ErrCodeNo, nil)
	fuzzseed.Add(f, buf.Bytes())
	fuzzseed.Add(f, []byte{0, 0, 4, 8, 0, 0, 0, 0, 1, 0, 0, 0, 1}) // WINDOW_UPDATE on stream 1
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		cc, err := NewClientConn(a, Config{PingInterval: -1, StreamWindow: 65535, ConnWindow: 65535, MaxFrameSize: 16384})
		if err != nil {
			t.Fatal(err)
		}
		drained := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, b)
			close(drained)
		}()
		connected := make(chan struct{})
		go func() {
			defer close(connected)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
			if err == nil {
				_, _ = io.Copy(io.Discard, s)
				_ = s.Close()
			}
		}()
		_ = b.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = b.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // empty SETTINGS
		_, _ = b.Write(data)
		_ = b.Close()
		for what, ch := range map[string]<-chan struct{}{"connection": cc.Done(), "Connect": connected, "drain": drained} {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not end after the peer closed", what)
			}
		}
		_ = cc.Close()
	})
}

// readMeta encodes fields as one HEADERS frame on stream 1 and reads it back
// the way a server connection does (HPACK decoding, header list limit,
// x/net's field validation). A nil frame means the framer refused it.
func readMeta(t *testing.T, fields []hpack.HeaderField) *http2.MetaHeadersFrame {
	t.Helper()
	var hbuf, buf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for _, hf := range fields {
		if err := enc.WriteField(hf); err != nil {
			t.Fatal(err)
		}
	}
	w := http2.NewFramer(&buf, nil)
	w.AllowIllegalWrites = true
	if err := w.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	r := http2.NewFramer(io.Discard, &buf)
	r.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.MaxHeaderListSize = DefaultServerMaxHeaderList
	r.SetMaxReadFrameSize(1 << 24)
	fr, err := r.ReadFrame()
	if err != nil {
		return nil
	}
	mh, ok := fr.(*http2.MetaHeadersFrame)
	if !ok {
		t.Fatalf("read %T, want headers", fr)
	}
	return mh
}

// FuzzParseRequest feeds CONNECT header sections, one "name: value" field
// per line, through HPACK and the framer into parseRequest. A request it
// accepts is a CONNECT with an authority and no connection-specific or
// pseudo field in its header, and it survives the client's encoding
// (requestFields) unchanged: what one side accepts the other can send.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		":method: CONNECT\n:authority: 10.0.0.1:8080\nbaggage: k8s.namespace.name=ns\nforwarded: for=10.0.0.2\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		":method: CONNECT\n:authority: [fd00::1]:80",
		":method: GET\n:scheme: https\n:path: /\n:authority: a",
		":method: CONNECT\n:authority: 10.0.0.1:80\nconnection: close",
		":method: CONNECT\n:authority: 10.0.0.1:80\nte: trailers\nhost: x",
		":status: 200",
		":method: CONNECT\n:protocol: websocket\n:authority: 10.0.0.1:80",
		"baggage: a=b\n:method: CONNECT\n:authority: 10.0.0.1:80",
	} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		var fields []hpack.HeaderField
		for line := range strings.SplitSeq(text, "\n") {
			name, value, _ := strings.Cut(line, ": ")
			fields = append(fields, hpack.HeaderField{Name: name, Value: value})
		}
		mh := readMeta(t, fields)
		if mh == nil {
			return
		}
		req, status, code := parseRequest(mh)
		if req == nil {
			if (status == 0) == (code == 0) {
				t.Fatalf("rejected with status %d and code %v: want exactly one", status, code)
			}
			return
		}
		if status != 0 || code != 0 {
			t.Fatalf("accepted with status %d, code %v", status, code)
		}
		if req.Method != http.MethodConnect || req.Authority == "" {
			t.Fatalf("accepted %q %q", req.Method, req.Authority)
		}
		for k := range req.Header {
			if strings.HasPrefix(k, ":") || connectionSpecific(strings.ToLower(k)) {
				t.Fatalf("header field %q passed", k)
			}
		}
		sent, err := requestFields(&Request{Authority: req.Authority, Header: req.Header})
		if err != nil {
			t.Fatalf("client cannot send an accepted request (%q): %v", req.Authority, err)
		}
		mh = readMeta(t, sent)
		if mh == nil {
			t.Fatalf("framer refused re-encoded request %v", sent)
		}
		again, _, _ := parseRequest(mh)
		want := req.Header.Clone()
		want.Del("Host")
		if again == nil || again.Authority != req.Authority || !reflect.DeepEqual(again.Header, want) {
			t.Fatalf("round trip of %q %v gave %+v", req.Authority, req.Header, again)
		}
	})
}
