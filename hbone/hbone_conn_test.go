package hbone

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// Connection-level behaviour: the stream limit, graceful and forced
// shutdown, a bad preface.

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
		go echoStream(s, nil)
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
	synctest.Test(t, func(t *testing.T) {
		// The handler holds the stream until the connection dies.
		ts := startServerOver(t, Config{}, sinkHandler, overPipe)
		cc := ts.client(t, Config{})
		s := connectStream(t, cc)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := ts.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown: %v, want deadline exceeded", err)
		}
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrConnClosed) {
			t.Fatalf("Read after forced shutdown: %v, want ErrConnClosed", err)
		}
	})
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
