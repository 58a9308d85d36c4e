package hbone

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// countingConn counts Write calls on a connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
	bytes  atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.Conn.Write(p)
}

// TestWriteCoalescing checks that bulk data leaves in large writes: at most
// one Write per ~64 KiB of payload, not one per frame or per Stream.Write.
func TestWriteCoalescing(t *testing.T) {
	ts := startServer(t, Config{}, discardHandler, false)
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingConn{Conn: nc}
	cc, err := NewClientConn(counted, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s := connectStream(t, cc)
	before := counted.writes.Load()
	const total, chunk = 32 << 20, 16 << 10 // many small Writes
	buf := make([]byte, chunk)
	for range total / chunk {
		if _, err := s.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.CloseWrite()
	_, _ = io.Copy(io.Discard, s)
	writes := counted.writes.Load() - before
	// Flow-control stalls may flush short batches; allow some slack.
	if limit := int64(total/(48<<10)) + 64; writes > limit {
		t.Fatalf("%d Writes for %d bytes in %d-byte Stream.Writes; want at most %d", writes, total, chunk, limit)
	}
	t.Logf("%d Writes, %.1f KiB each on average", writes, float64(total)/float64(writes)/1024)
}

// TestSteadyStateAllocs guards the data path: an echo round trip of 64 KiB
// through client and server allocates nothing once warmed up (only the
// rare WINDOW_UPDATE frame the framer parses allocates).
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ts := startServer(t, Config{}, echoHandler, false)
	cc := ts.client(t, Config{})
	s := connectStream(t, cc)
	out := make([]byte, 64<<10)
	in := make([]byte, 64<<10)
	roundTrip := func() {
		if _, err := s.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, in); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 { // warm pools and buffers
		roundTrip()
	}
	if allocs := testing.AllocsPerRun(200, roundTrip); allocs > 0.5 {
		t.Fatalf("%.2f allocations per 64 KiB echo round trip, want ~0", allocs)
	}
	_ = s.CloseWrite()
	_, _ = io.Copy(io.Discard, s)
}
