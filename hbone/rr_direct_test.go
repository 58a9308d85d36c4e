package hbone

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeSink is a DirectSink standing in for the engine's relay: it takes
// all, part or none of what it is offered in turn (a socket that fills),
// and refuses while its "loop" holds bytes (busy), as the relay does, so
// that what it took and what the loop read land in out in the order the
// peer sent them.
type fakeSink struct {
	chanWaker
	busy atomic.Bool

	mu             sync.Mutex // guards the following fields
	out            bytes.Buffer
	calls, partial int
	taken          int
}

func (f *fakeSink) TryDeliver(p []byte) int {
	if f.busy.Load() {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	n := len(p)
	switch f.calls % 3 {
	case 1:
		n /= 2 // a partial write
		f.partial++
	case 2:
		n = 0 // EAGAIN
		f.partial++
	}
	f.out.Write(p[:n])
	f.taken += n
	if n > 0 {
		f.chanWaker.Wake() // not the stream's wake-up: the test's own, for what reached "the socket"
	}
	return n
}

// read is the loop's turn: take what the stream buffered (busy set first,
// as the relay's flagDownBusy) and append it.
func (f *fakeSink) read(s *Stream, buf []byte) (int, error) {
	f.busy.Store(true)
	defer f.busy.Store(false)
	n, err := s.TryRead(buf)
	f.mu.Lock()
	f.out.Write(buf[:n])
	f.mu.Unlock()
	return n, err
}

// TestDirectSinkOrderAndCredit runs round trips of up to 1,800 bytes
// through a stream whose Waker is a DirectSink that often takes only part
// of a payload or none: every byte must come out once and in order,
// through the sink or TryRead, and END_STREAM after the last; and the
// bytes the sink took must return their window (the client's windows are
// far below the transfer, so a lost credit stalls it).
func TestDirectSinkOrderAndCredit(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{StreamWindow: 65535, ConnWindow: 65535})
	s := connectStream(t, cc)
	defer s.Close()
	f := &fakeSink{chanWaker: make(chanWaker, 1)}
	s.SetWaker(f)
	const trips = 1500
	want, err := io.ReadAll(randomReader(23, trips*1800))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<10)
	// drain reads until out holds upTo bytes, or the stream ends.
	drain := func(upTo int) error {
		for {
			f.mu.Lock()
			have := f.out.Len()
			f.mu.Unlock()
			if have >= upTo {
				return nil
			}
			k, err := f.read(s, buf)
			if err != nil {
				return err
			}
			if k == 0 {
				select {
				case <-f.chanWaker:
				case <-testContext(t).Done():
					return fmt.Errorf("stalled at %d of %d bytes (%d taken directly)", have, upTo, f.taken)
				}
			}
		}
	}
	sent := 0
	for i := range trips {
		k := 1 + (i*7919)%1800
		if _, err := s.Write(want[sent : sent+k]); err != nil {
			t.Fatal(err)
		}
		sent += k
		if err := drain(sent); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := drain(sent + 1); !errors.Is(err, io.EOF) {
		t.Fatalf("after the round trips: %v, want io.EOF", err)
	}
	s.SetWaker(nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("%d bytes, %d taken directly in %d offers (%d partial or refused)", f.out.Len(), f.taken, f.calls, f.partial)
	if !bytes.Equal(f.out.Bytes(), want[:sent]) {
		t.Fatalf("%d bytes out differ from the %d sent: order or bytes lost", f.out.Len(), sent)
	}
	if f.taken < sent/4 || f.partial == 0 {
		t.Fatalf("the sink took %d of %d bytes in %d offers (%d partial): the direct path was not exercised", f.taken, sent, f.calls, f.partial)
	}
}

// TestDirectSinkBarrier: once SetWaker(nil) has returned, the old sink is
// offered nothing more (the relay may close its socket).
func TestDirectSinkBarrier(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{})
	s := connectStream(t, cc)
	defer s.Close()
	var after atomic.Bool
	f := &barrierSink{chanWaker: make(chanWaker, 1), after: &after}
	s.SetWaker(f)
	for i := range 200 {
		if _, err := s.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	s.SetWaker(nil)
	after.Store(true)
	if _, err := s.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Whatever the sink did not take is read here, the rest after it.
	if _, err := io.Copy(io.Discard, s); err != nil {
		t.Fatal(err)
	}
	if f.late.Load() {
		t.Fatal("TryDeliver ran after SetWaker(nil) returned")
	}
}

// barrierSink takes everything, and notes an offer made after the test
// removed it.
type barrierSink struct {
	chanWaker
	after *atomic.Bool
	late  atomic.Bool
}

func (b *barrierSink) TryDeliver(p []byte) int {
	if b.after.Load() {
		b.late.Store(true)
	}
	return len(p)
}
