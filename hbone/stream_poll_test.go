package hbone

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"golang.org/x/net/http2"
)

// readerFunc is a function as an io.Reader, the source WriteFrom reads.
type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// chanWaker records wake-ups in a channel of one, as an event loop's
// coalescing task queue does.
type chanWaker chan struct{}

func (w chanWaker) Wake() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// pollEcho drives s with TryWrite/TryRead only, like an event loop: n
// random bytes out (within WriteWindow), then END_STREAM, while reading the
// echo; it waits on the waker whenever neither side can progress. With
// peek it reads through Peek and Consume, taking at most 24 KiB of each
// view, as a socket that takes part of a write does; with fill it writes
// through WriteFrom, reading the source straight into the stream's buffer
// (at most 40 KiB at a time, as a socket read).
func pollEcho(t *testing.T, s *Stream, w chanWaker, seed uint64, n int64, peek, fill bool) error {
	src := randomReader(seed, n)
	want, got := sha256.New(), sha256.New()
	out := make([]byte, 0, 40<<10)
	in := make([]byte, 24<<10)
	var sent, recvd int64
	srcDone, closed, eof := false, false, false
	for !eof {
		moved := false
		if !closed && fill && !srcDone {
			// Overrunning a send window would be the server's
			// FLOW_CONTROL_ERROR, which fails the echo.
			k, rerr, werr := s.WriteFrom(40<<10, readerFunc(func(p []byte) (int, error) {
				if len(p) > 40<<10 {
					return 0, fmt.Errorf("WriteFrom offered %d bytes, over its limit", len(p))
				}
				m, err := src.Read(p)
				want.Write(p[:m])
				if err == io.EOF {
					srcDone = true
					err = nil
				}
				if m == 0 && err == nil {
					err = io.EOF
				}
				return m, err
			}))
			switch {
			case werr != nil:
				return fmt.Errorf("WriteFrom: %v", werr)
			case rerr != nil && rerr != io.EOF:
				return rerr
			}
			sent += int64(k)
			moved = moved || k > 0
		}
		if !closed {
			if len(out) == 0 && !srcDone && !fill {
				if win := s.WriteWindow(); win > 0 {
					m, err := src.Read(out[:min(win, cap(out))])
					out = out[:m]
					want.Write(out)
					if err == io.EOF {
						srcDone = true
					}
				} else if _, err := s.TryWrite(nil); err != nil {
					return fmt.Errorf("TryWrite: %v", err)
				}
			}
			if len(out) > 0 {
				k, err := s.TryWrite(out)
				if err != nil {
					return fmt.Errorf("TryWrite: %v", err)
				}
				sent += int64(k)
				out = out[:copy(out, out[k:])]
				moved = moved || k > 0
			}
			if srcDone && len(out) == 0 {
				if err := s.CloseWrite(); err != nil {
					return err
				}
				closed, moved = true, true
			}
		}
		var k int
		var err error
		if peek {
			var views [][]byte
			views, err = s.Peek(make([][]byte, 0, 3))
			for _, v := range views {
				v = v[:min(len(v), len(in)-k)]
				got.Write(v)
				k += len(v)
			}
			s.Consume(k)
		} else {
			k, err = s.TryRead(in)
			got.Write(in[:k])
		}
		recvd += int64(k)
		moved = moved || k > 0
		switch {
		case err == io.EOF:
			eof = true
		case err != nil:
			return fmt.Errorf("TryRead after %d bytes: %v", recvd, err)
		}
		if !moved && !eof {
			select {
			case <-w:
			case <-testContext(t).Done():
				return fmt.Errorf("no wake-up: sent %d, received %d of %d", sent, recvd, n)
			}
		}
	}
	if sent != n || recvd != n || !bytes.Equal(want.Sum(nil), got.Sum(nil)) {
		return fmt.Errorf("sent %d, echoed %d of %d bytes; checksums match: %v", sent, recvd, n, bytes.Equal(want.Sum(nil), got.Sum(nil)))
	}
	return nil
}

// TestStreamPoll drives streams without blocking calls through windows
// small enough that they shut again and again, so progress depends on the
// wake-ups for data, stream and connection WINDOW_UPDATEs and write-buffer
// room.
func TestStreamPoll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		server  Config // its windows are what our client may send
		streams int
		n       int64
	}{
		{"default windows", Config{}, 1, 8 << 20},
		{"small stream window", Config{StreamWindow: 65535}, 1, 4 << 20},
		{"small connection window", Config{StreamWindow: 1 << 20, ConnWindow: 65535}, 4, 2 << 20},
		{"empty", Config{}, 1, 0},
	} {
		for _, mode := range []struct {
			name       string
			peek, fill bool
		}{{"TryRead", false, false}, {"Peek", true, false}, {"WriteFrom+Peek", true, true}} {
			peek, fill := mode.peek, mode.fill
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				ts := startServer(t, tc.server, echoHandler, false)
				cc := ts.client(t, Config{StreamWindow: 65535})
				done := make(chan struct{})
				for i := range tc.streams {
					go func() {
						defer func() { done <- struct{}{} }()
						s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
						if err != nil {
							t.Error(err)
							return
						}
						defer s.Close()
						w := make(chanWaker, 1)
						s.SetWaker(w)
						defer s.SetWaker(nil)
						if err := pollEcho(t, s, w, uint64(40+i), tc.n, peek, fill); err != nil {
							t.Error(err)
						}
					}()
				}
				for range tc.streams {
					<-done
				}
			})
		}
	}
}

// TestStreamPeekReset: a reset that arrives while a Peek's view is lent
// leaves the view alone (the buffer is freed by the Consume that ends it),
// and the next Peek reports the reset.
func TestStreamPeekReset(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{})
	s := connectStream(t, cc)
	w := make(chanWaker, 1)
	s.SetWaker(w)
	msg := []byte("peek at me")
	if _, err := s.TryWrite(msg); err != nil {
		t.Fatal(err)
	}
	var view []byte
	for len(view) < len(msg) {
		s.Consume(0)
		views, err := s.Peek(make([][]byte, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if len(views) > 0 {
			view = views[0]
		}
		if len(view) < len(msg) {
			select {
			case <-w:
			case <-testContext(t).Done():
				t.Fatal("no echo")
			}
		}
	}
	_ = s.Reset(http2.ErrCodeCancel)
	if !bytes.Equal(view, msg) {
		t.Fatalf("view after the reset holds %q, want %q", view, msg)
	}
	s.mu.Lock()
	chunks := len(s.rbuf.chunks) - s.rbuf.head
	s.mu.Unlock()
	if chunks == 0 {
		t.Fatal("the reset freed the chunk under a lent view")
	}
	s.Consume(len(view))
	s.mu.Lock()
	chunks = len(s.rbuf.chunks) - s.rbuf.head
	s.mu.Unlock()
	if chunks != 0 {
		t.Fatalf("%d chunks left after the view ended", chunks)
	}
	if _, err := s.Peek(nil); !errors.Is(err, ErrStreamClosed) {
		t.Fatalf("Peek after the reset: %v, want ErrStreamClosed", err)
	}
}

// TestStreamPollReset: a reset by the peer wakes the stream, and TryRead
// and TryWrite report it.
func TestStreamPollReset(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{})
	s := connectStream(t, cc)
	w := make(chanWaker, 1)
	s.SetWaker(w)
	if _, err := s.TryWrite([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The echo handler closes its stream on a write error; abort it from
	// our side through the server by closing the whole server.
	_ = ts.Close()
	for {
		_, rerr := s.TryRead(make([]byte, 10))
		if rerr != nil && rerr != io.EOF {
			if !errors.Is(rerr, ErrConnClosed) {
				t.Fatalf("TryRead: %v, want ErrConnClosed", rerr)
			}
			break
		}
		select {
		case <-w:
		case <-testContext(t).Done():
			t.Fatal("no wake-up after the connection ended")
		}
	}
	if _, err := s.TryWrite(nil); err == nil {
		t.Fatal("TryWrite(nil) reports no error after the connection ended")
	}
}

// TestStreamWriteFromNothingRead: a read that takes nothing (EAGAIN, an
// error, or more than it was offered) queues nothing and gives the send
// window back, and WriteFrom fails as TryWrite does after CloseWrite.
func TestStreamWriteFromNothingRead(t *testing.T) {
	errAgain := errors.New("would block")
	for _, tc := range []struct {
		name    string
		read    func(p []byte) (int, error)
		wantErr string
	}{
		{"would block", func([]byte) (int, error) { return 0, errAgain }, "would block"},
		{"zero without error", func([]byte) (int, error) { return 0, nil }, ""},
		{"more than offered", func(p []byte) (int, error) { return len(p) + 1, nil }, "at most"},
		{"negative", func([]byte) (int, error) { return -1, nil }, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{}, echoHandler, false)
			cc := ts.client(t, Config{})
			s := connectStream(t, cc)
			before := s.WriteWindow()
			n, rerr, werr := s.WriteFrom(1<<10, readerFunc(tc.read))
			if n != 0 || werr != nil {
				t.Fatalf("WriteFrom = %d, write error %v; want 0, nil", n, werr)
			}
			if (rerr == nil) != (tc.wantErr == "") || (rerr != nil && !strings.Contains(rerr.Error(), tc.wantErr)) {
				t.Fatalf("read error %v, want %q", rerr, tc.wantErr)
			}
			if after := s.WriteWindow(); after != before {
				t.Fatalf("send window %d after a read that took nothing, was %d", after, before)
			}
			// The stream still works: a real write echoes back.
			if n, _, err := s.WriteFrom(1<<10, readerFunc(func(p []byte) (int, error) { return copy(p, "ping"), nil })); n != 4 || err != nil {
				t.Fatalf("WriteFrom(ping) = %d, %v", n, err)
			}
			if err := s.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(s)
			if err != nil || string(got) != "ping" {
				t.Fatalf("echo %q, %v", got, err)
			}
			if _, _, err := s.WriteFrom(1<<10, readerFunc(func(p []byte) (int, error) {
				t.Error("read called after CloseWrite")
				return 0, nil
			})); !errors.Is(err, ErrWriteAfterClose) {
				t.Fatalf("WriteFrom after CloseWrite: %v, want ErrWriteAfterClose", err)
			}
		})
	}
}
