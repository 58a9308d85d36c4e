package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/http2"
)

// Stream ends: half-close, reset, unclean close, deadlines, a cancelled
// Connect.

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
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{}, func(_ context.Context, req *ServerRequest) {
			s, _ := req.Respond(http.StatusOK, nil)
			// Never writes; closes once the client does.
			_, _ = io.Copy(io.Discard, s)
			s.Close()
		}, overPipe)
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
	})
}

func TestWriteDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{StreamWindow: 65535, ConnWindow: 1 << 20}
		ts := startServerOver(t, cfg, func(_ context.Context, req *ServerRequest) {
			// Never reads: the client's stream window runs out.
			_, _ = req.Respond(http.StatusOK, nil)
		}, overPipe)
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
	})
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
