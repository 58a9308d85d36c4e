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

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// Stream ends: half-close, reset, unclean close, deadlines, a cancelled
// Connect.

func TestHalfClose(t *testing.T) {
	pairs := newStreamPairs(t)
	cc := pairs.cc

	t.Run("client closes first", func(t *testing.T) {
		c, s := pairs.open(t)
		sendAndEnd(t, c, s, "request", "server", func() {
			if _, err := c.Write([]byte("x")); !errors.Is(err, ErrWriteAfterClose) {
				t.Errorf("Write after CloseWrite: %v", err)
			}
		})
		// The other direction still works.
		sendAndEnd(t, s, c, "response", "client", nil)
	})
	t.Run("server closes first", func(t *testing.T) {
		c, s := pairs.open(t)
		sendAndEnd(t, s, c, "banner", "client", nil)
		sendAndEnd(t, c, s, "late request", "server", nil)
	})
	waitFor(t, "streams to retire", func() bool { return cc.NumActiveStreams() == 0 })
}

// streamPairs is a server that hands over the server end of each stream
// it answers, and a client connection to it.
type streamPairs struct {
	cc     *ClientConn
	server chan *Stream
}

func newStreamPairs(t *testing.T) *streamPairs {
	t.Helper()
	p := &streamPairs{server: make(chan *Stream, 1)}
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			t.Error(err)
			return
		}
		p.server <- s
	}, false)
	p.cc = ts.client(t, Config{})
	return p
}

// open opens a stream and returns its client and server ends, closed at
// t's cleanup.
func (p *streamPairs) open(t *testing.T) (c, s *Stream) {
	t.Helper()
	c = connectStream(t, p.cc)
	s = <-p.server
	t.Cleanup(func() { s.Close() })
	return c, s
}

// sendAndEnd writes msg on from and half-closes it, runs then (if not nil),
// and checks that to reads exactly msg and then EOF.
func sendAndEnd(t *testing.T, from, to *Stream, msg, reader string, then func()) {
	t.Helper()
	if _, err := from.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	if err := from.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if then != nil {
		then()
	}
	got, err := io.ReadAll(to)
	if err != nil || string(got) != msg {
		t.Fatalf("%s read %q, %v", reader, got, err)
	}
}

// waitFor polls cond; the deadline is a hang guard only.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !nettest.Until(testTimeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestReset(t *testing.T) {
	pairs := newStreamPairs(t)
	cc := pairs.cc

	for _, tc := range []struct {
		name      string
		clientRST bool
	}{{"client resets", true}, {"server resets", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pairs.open(t)
			resetter, victim := c, s
			if !tc.clientRST {
				resetter, victim = s, c
			}
			if _, err := resetter.Write([]byte("data before the reset")); err != nil {
				t.Fatal(err)
			}
			err := resetter.Reset(http2.ErrCodeConnect)
			if err != nil {
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
	c, s := newStreamPairs(t).open(t)
	_ = c.Close()
	var se *StreamError
	if _, err := s.Read(make([]byte, 1)); !errors.As(err, &se) || se.Code != http2.ErrCodeCancel {
		t.Fatalf("server Read after client Close: %v, want CANCEL", err)
	}
}

func TestReadDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{}, sinkHandler, overPipe) // never writes
		cc := ts.client(t, Config{})
		c := connectStream(t, cc)
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
		c := connectStream(t, cc)
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
