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
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
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
	for _, tc := range []struct {
		name string
		tp   transport
	}{{"tcp", overTCP}, {"tls", overTLS}, {"tls record layer", overRecord}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServerOver(t, Config{}, echoHandler, tc.tp)
			cc := ts.client(t, Config{})
			s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
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
	for _, tc := range []struct {
		name string
		tp   transport
	}{{"tcp", overTCP}, {"tls", overTLS}, {"tls record layer", overRecord}} {
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

func TestHalfClose(t *testing.T) {
	serverSide := make(chan *Stream, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			t.Error(err)
			return
		}
		serverSide <- s
	}, false)
	cc := ts.client(t, Config{})
	ctx := testContext(t)

	t.Run("client closes first", func(t *testing.T) {
		c, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s := <-serverSide
		defer s.Close()
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, ErrWriteAfterClose) {
			t.Errorf("Write after CloseWrite: %v", err)
		}
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "request" {
			t.Fatalf("server read %q, %v", got, err)
		}
		// The other direction still works.
		if _, err := s.Write([]byte("response")); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err = io.ReadAll(c)
		if err != nil || string(got) != "response" {
			t.Fatalf("client read %q, %v", got, err)
		}
	})
	t.Run("server closes first", func(t *testing.T) {
		c, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s := <-serverSide
		defer s.Close()
		if _, err := s.Write([]byte("banner")); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "banner" {
			t.Fatalf("client read %q, %v", got, err)
		}
		if _, err := c.Write([]byte("late request")); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err = io.ReadAll(s)
		if err != nil || string(got) != "late request" {
			t.Fatalf("server read %q, %v", got, err)
		}
	})
	waitFor(t, "streams to retire", func() bool { return cc.NumActiveStreams() == 0 })
}

// waitFor polls cond; the deadline is a hang guard only.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReset(t *testing.T) {
	serverSide := make(chan *Stream, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			t.Error(err)
			return
		}
		serverSide <- s
	}, false)
	cc := ts.client(t, Config{})
	ctx := testContext(t)

	for _, tc := range []struct {
		name      string
		clientRST bool
	}{{"client resets", true}, {"server resets", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := <-serverSide
			defer s.Close()
			resetter, victim := c, s
			if !tc.clientRST {
				resetter, victim = s, c
			}
			if _, err := resetter.Write([]byte("data before the reset")); err != nil {
				t.Fatal(err)
			}
			if err := resetter.Reset(http2.ErrCodeConnect); err != nil {
				t.Fatal(err)
			}
			var se *StreamError
			buf := make([]byte, 100)
			for {
				_, err = victim.Read(buf)
				if err != nil {
					break
				}
			}
			if !errors.As(err, &se) || se.Code != http2.ErrCodeConnect || se.Local {
				t.Fatalf("Read after peer reset: %v, want StreamError CONNECT_ERROR", err)
			}
			waitFor(t, "write to fail", func() bool {
				_, err := victim.Write([]byte("x"))
				return errors.As(err, &se)
			})
			if _, err := resetter.Read(buf); !errors.Is(err, ErrStreamClosed) || !errors.Is(err, net.ErrClosed) {
				t.Errorf("Read after own reset: %v", err)
			}
			if _, err := resetter.Write(buf); !errors.Is(err, ErrStreamClosed) {
				t.Errorf("Write after own reset: %v", err)
			}
		})
	}
	waitFor(t, "streams to retire", func() bool { return cc.NumActiveStreams() == 0 })
}

// TestCloseUnclean checks that Close of a stream still open resets it.
func TestCloseUnclean(t *testing.T) {
	serverSide := make(chan *Stream, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		serverSide <- s
	}, false)
	cc := ts.client(t, Config{})
	c, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	s := <-serverSide
	defer s.Close()
	_ = c.Close()
	var se *StreamError
	if _, err := s.Read(make([]byte, 1)); !errors.As(err, &se) || se.Code != http2.ErrCodeCancel {
		t.Fatalf("server Read after client Close: %v, want CANCEL", err)
	}
}

func TestReadDeadline(t *testing.T) {
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		// Never writes; closes once the client does.
		_, _ = io.Copy(io.Discard, s)
		s.Close()
	}, false)
	cc := ts.client(t, Config{})
	c, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read: %v, want deadline exceeded", err)
	}
	// Past deadlines fail at once; clearing the deadline makes Read block
	// again (checked by the write deadline path below not interfering).
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read: %v, want deadline exceeded", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	_ = c.CloseWrite()
}

func TestWriteDeadline(t *testing.T) {
	cfg := Config{StreamWindow: 65535, ConnWindow: 1 << 20}
	ts := startServer(t, cfg, func(_ context.Context, req *ServerRequest) {
		// Never reads: the client's stream window runs out.
		_, _ = req.Respond(http.StatusOK, nil)
	}, false)
	cc := ts.client(t, Config{})
	c, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write: %d, %v; want deadline exceeded", n, err)
	}
	if n != 65535 {
		t.Errorf("wrote %d bytes, want exactly the stream window 65535", n)
	}
}

func TestConnectContextCancel(t *testing.T) {
	release := make(chan struct{})
	ts := startServer(t, Config{}, func(ctx context.Context, req *ServerRequest) {
		select {
		case <-ctx.Done(): // the client's RST_STREAM cancels the handler
		case <-release:
		}
	}, false)
	defer close(release)
	cc := ts.client(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
		errc <- err
	}()
	waitFor(t, "the stream to open", func() bool { return cc.NumActiveStreams() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect: %v, want context.Canceled", err)
	}
	waitFor(t, "the stream to retire", func() bool { return cc.NumActiveStreams() == 0 })
}

func TestStreamLimitOnConn(t *testing.T) {
	hold := make(chan struct{})
	ts := startServer(t, Config{MaxStreams: 2}, func(_ context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		<-hold
		s.Close()
	}, false)
	defer close(hold)
	cc := ts.client(t, Config{})
	ctx := testContext(t)
	// The first stream teaches the client the server's limit.
	s1, err := cc.Connect(ctx, &Request{Authority: "a:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := cc.Connect(ctx, &Request{Authority: "a:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if cc.CanTakeNewStream() {
		t.Error("CanTakeNewStream at the peer's limit")
	}
	if _, err := cc.Connect(ctx, &Request{Authority: "a:1"}); !errors.Is(err, ErrStreamLimit) {
		t.Fatalf("third Connect: %v, want ErrStreamLimit", err)
	}
}

func TestGracefulShutdown(t *testing.T) {
	started := make(chan *Stream, 1)
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			return
		}
		started <- s
		go func() {
			defer s.Close()
			_, _ = io.Copy(s, s)
			_ = s.CloseWrite()
		}()
	}, false)
	cc := ts.client(t, Config{})
	ctx := testContext(t)
	inflight, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Close()
	<-started

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- ts.Shutdown(ctx) }()
	waitFor(t, "the client to see GOAWAY", func() bool { return !cc.CanTakeNewStream() })
	if _, err := cc.Connect(ctx, &Request{Authority: "10.0.0.1:80"}); !errors.Is(err, ErrGoingAway) {
		t.Fatalf("Connect after GOAWAY: %v, want ErrGoingAway", err)
	}
	// The in-flight stream still works both ways and finishes.
	echoRoundTrip(t, inflight, 7, 1<<20, 32<<10)
	if err := <-shutdownErr; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-cc.Done():
	case <-time.After(testTimeout):
		t.Fatal("client connection not closed after the drain")
	}
	if err := <-ts.serveErrs; err != nil {
		t.Errorf("ServeConn: %v", err)
	}
	// New connections are refused.
	nc, err := ts.dial(ctx)
	if err == nil {
		defer nc.Close()
		if _, err := io.ReadAll(nc); err != nil && !isConnReset(err) {
			t.Errorf("read after shutdown: %v", err)
		}
	}
}

func TestShutdownDeadline(t *testing.T) {
	ts := startServer(t, Config{}, func(ctx context.Context, req *ServerRequest) {
		s, _ := req.Respond(http.StatusOK, nil)
		// Holds the stream until the connection dies.
		_, _ = io.Copy(io.Discard, s)
		s.Close()
	}, false)
	cc := ts.client(t, Config{})
	s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want deadline exceeded", err)
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Read after forced shutdown: %v, want ErrConnClosed", err)
	}
}

func TestClientCloseFailsStreams(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{})
	s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 10))
		readErr <- err
	}()
	_ = cc.Close()
	if err := <-readErr; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Read: %v, want ErrConnClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Write: %v, want ErrConnClosed", err)
	}
	if cc.CanTakeNewStream() {
		t.Error("CanTakeNewStream after Close")
	}
	if _, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"}); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Connect after Close: %v", err)
	}
}

func TestBadPreface(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = nc.SetReadDeadline(time.Now().Add(testTimeout))
	_, _ = io.Copy(io.Discard, nc) // the server's SETTINGS, then EOF
	if err := <-ts.serveErrs; !errors.Is(err, ErrBadPreface) {
		t.Fatalf("ServeConn: %v, want ErrBadPreface", err)
	}
}

// TestDirectWrites checks that an event loop's small writes (WriteFrom)
// over a transport that can write without blocking (mtls/record) leave
// through the loop, not the writer goroutine, and arrive intact, and that
// over crypto/tls they never do.
func TestDirectWrites(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tp     transport
		direct bool
	}{{"tls record layer", overRecord, true}, {"crypto/tls", overTLS, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServerOver(t, Config{}, echoHandler, tc.tp)
			cc := ts.client(t, Config{})
			s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			buf := make([]byte, 100)
			for i := range 50 {
				msg := fmt.Appendf(nil, "round trip %d", i)
				n, rerr, werr := s.WriteFrom(len(msg), bytes.NewReader(msg))
				if rerr != nil || werr != nil || n != len(msg) {
					t.Fatalf("WriteFrom = %d, %v, %v; want %d", n, rerr, werr, len(msg))
				}
				if _, err := io.ReadFull(s, buf[:len(msg)]); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf[:len(msg)], msg) {
					t.Fatalf("echo %q, want %q", buf[:len(msg)], msg)
				}
			}
			c := cc.c
			c.wmu.Lock()
			direct := c.directWrites
			c.wmu.Unlock()
			if got := direct > 0; got != tc.direct {
				t.Fatalf("%d of 50 writes direct; want some: %v", direct, tc.direct)
			}
		})
	}
}
