package hbone

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
)

// randomReader yields a deterministic pseudo-random byte stream.
func randomReader(seed uint64, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}), n)
}

// echoRoundTrip writes n random bytes on s (then half-closes) while reading
// the echo, and checks the echo's checksum.
func echoRoundTrip(t testing.TB, s *Stream, seed uint64, n int64, writeSize int) {
	t.Helper()
	want := sha256.New()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, writeSize)
		_, err := io.CopyBuffer(struct{ io.Writer }{s}, io.TeeReader(randomReader(seed, n), want), buf)
		if err == nil {
			err = s.CloseWrite()
		}
		errc <- err
	}()
	got := sha256.New()
	m, err := io.Copy(got, s)
	if err != nil {
		t.Fatalf("reading echo: %v after %d bytes", err, m)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if m != n || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("echo of %d bytes: got %d bytes, checksum match %v", n, m, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
}

func TestEchoLarge(t *testing.T) {
	for _, tc := range socketTransports {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServerOver(t, Config{}, echoHandler, tc.tp)
			cc := ts.client(t, Config{})
			s := connectStream(t, cc)
			if got := s.ResponseHeader().Get("baggage"); got != "k8s.cluster.name=test" {
				t.Errorf("response baggage %q", got)
			}
			// 64 MiB exceeds both windows several times over.
			echoRoundTrip(t, s, 1, 64<<20, 64<<10)
		})
	}
}

// TestEchoSmallWindows forces flow control to stall constantly, with odd
// write sizes and the smallest frames.
func TestEchoSmallWindows(t *testing.T) {
	cfg := Config{StreamWindow: 65535, ConnWindow: 65535, MaxFrameSize: 16384}
	ts := startServer(t, cfg, echoHandler, false)
	cc := ts.client(t, cfg)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			echoRoundTrip(t, s, uint64(i), 3<<20+7, 70001)
		})
	}
	wg.Wait()
}

func TestManyStreams(t *testing.T) {
	for _, tc := range socketTransports {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServerOver(t, Config{}, echoHandler, tc.tp)
			cc := ts.client(t, Config{MaxStreams: 200})
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Go(func() {
					s, err := cc.Connect(testContext(t), &Request{Authority: fmt.Sprintf("10.0.%d.%d:80", i/256, i%256)})
					if err != nil {
						t.Error(err)
						return
					}
					defer s.Close()
					echoRoundTrip(t, s, uint64(i), int64(1+i*97), 1000+i)
				})
			}
			wg.Wait()
			if n := cc.NumActiveStreams(); n != 0 {
				t.Errorf("%d streams still active", n)
			}
		})
	}
}

func TestRequestHeaders(t *testing.T) {
	got := make(chan *ServerRequest, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		got <- req
		_, _ = req.Respond(http.StatusUnauthorized, nil)
	}, true)
	cc := ts.client(t, Config{})
	_, err := cc.Connect(testContext(t), &Request{
		Authority: "10.1.2.3:8080",
		Header: http.Header{
			"Forwarded":   {`for="10.0.0.9:4444"`},
			"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			"Connection":  {"close"}, // connection-specific: dropped
		},
	})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("Connect error %v, want StatusError 401", err)
	}
	if want := "hbone: CONNECT refused with status 401"; err.Error() != want {
		t.Errorf("error text %q, want %q", err, want)
	}
	req := <-got
	if req.Method != "CONNECT" || req.Authority != "10.1.2.3:8080" {
		t.Errorf("request %s %s", req.Method, req.Authority)
	}
	if req.Header.Get("Forwarded") != `for="10.0.0.9:4444"` || req.Header.Get("Traceparent") == "" {
		t.Errorf("request headers %v", req.Header)
	}
	if req.Header.Get("Connection") != "" {
		t.Errorf("connection-specific header forwarded: %v", req.Header)
	}
	if _, ok := req.Conn.RemoteAddr().(*net.TCPAddr); !ok {
		t.Errorf("request Conn %T", req.Conn)
	}
}

func TestStatusCodes(t *testing.T) {
	for _, code := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
				s, err := req.Respond(code, nil)
				if s != nil || err != nil {
					t.Errorf("Respond(%d) = %v, %v; want nil, nil", code, s, err)
				}
			}, false)
			cc := ts.client(t, Config{})
			_, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
			var se *StatusError
			if !errors.As(err, &se) || se.Code != code {
				t.Fatalf("Connect error %v, want StatusError %d", err, code)
			}
			if !cc.CanTakeNewStream() {
				t.Error("connection unusable after a refused CONNECT")
			}
		})
	}
}

func TestHandlerWithoutRespond(t *testing.T) {
	ts := startServer(t, Config{}, func(context.Context, *ServerRequest) {}, false)
	cc := ts.client(t, Config{})
	_, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
		t.Fatalf("Connect error %v, want StatusError 503", err)
	}
}
