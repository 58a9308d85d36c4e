// The transfer scenarios: bytes arrive intact and counted, in bulk, in
// messages of every size, through many relays at once and past a slow
// reader; and the byte helpers they share (a reproducible stream, its
// digest, the echoing server).

package enginetest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
)

// stream is a reproducible pseudo-random byte source.
func stream(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

func digest(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, n, err
}

func deadline(cs ...*net.TCPConn) {
	for _, c := range cs {
		c.SetDeadline(time.Now().Add(hang))
	}
}

// progress is a connection whose every Read and Write must complete within
// hang: the safety net of a transfer too large to finish within hang.
type progress struct{ c *net.TCPConn }

func (p progress) Read(b []byte) (int, error) {
	_ = p.c.SetReadDeadline(time.Now().Add(hang))
	return p.c.Read(b)
}

func (p progress) Write(b []byte) (int, error) {
	_ = p.c.SetWriteDeadline(time.Now().Add(hang))
	return p.c.Write(b)
}

// send writes size bytes of stream(seed) to w on a goroutine of its own
// and, with closeWrite, half-closes w after them; the channel gets the
// outcome.
func send(w *net.TCPConn, seed uint64, size int64, closeWrite bool) <-chan error {
	errs := make(chan error, 1)
	go func() {
		_, err := io.Copy(w, stream(seed, size))
		if err == nil && closeWrite {
			err = w.CloseWrite()
		}
		errs <- err
	}()
	return errs
}

// echo makes the server side copy everything back and half-close at EOF.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// roundTrip sends size random bytes through an echoing server and checks
// what comes back.
func roundTrip(t testing.TB, p *Pair, size int64, seed uint64) {
	t.Helper()
	deadline(p.Client, p.Server)
	go echo(p.Server)
	want, _, _ := digest(stream(seed, size))
	werr := send(p.Client, seed, size, true)
	got, n, err := digest(p.Client)
	if err != nil || n != size {
		t.Fatalf("read back %d of %d bytes: %v", n, size, err)
	}
	if got != want {
		t.Fatal("echoed bytes differ from those sent")
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	p.wantClean(t)
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != size || b != size {
		t.Fatalf("counters A→B %d B→A %d, want %d each", a, b, size)
	}
}

func testEcho(t *testing.T, e *engine.Engine, k kit) {
	for i, size := range []int64{0, 1, 1000, 65536 + 3, 1 << 20} {
		roundTrip(t, k.pair(t, e), size, uint64(i))
	}
}

func testLarge(t *testing.T, e *engine.Engine, k kit) {
	size := int64(64 << 20)
	if testing.Short() {
		size = 8 << 20
	}
	p := k.pair(t, e)
	// Independent streams each way, at the same time. The safety net is a
	// deadline on each read and write, not on the whole transfer: under
	// -race on a loaded machine a healthy relay may take longer than hang
	// for all of it, but never that long without moving a byte.
	check := func(name string, w, r *net.TCPConn, seed uint64, errs chan<- error) {
		go func() {
			_, err := io.Copy(progress{w}, stream(seed, size))
			if err == nil {
				err = w.CloseWrite()
			}
			if err != nil {
				errs <- err
			}
		}()
		want, _, _ := digest(stream(seed, size))
		got, n, err := digest(progress{r})
		switch {
		case err != nil:
			errs <- err
		case n != size || got != want:
			errs <- errors.New(name + ": bytes differ from those sent")
		default:
			errs <- nil
		}
	}
	errs := make(chan error, 4)
	go check("A→B", p.Client, p.Server, 1, errs)
	go check("B→A", p.Server, p.Client, 2, errs)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	p.wantClean(t)
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != size || b != size {
		t.Fatalf("counters %d/%d, want %d", a, b, size)
	}
}

func testMany(t *testing.T, e *engine.Engine, k kit) {
	n := 200
	if testing.Short() {
		n = 50
	}
	pairs := make([]*Pair, n)
	for i := range pairs {
		pairs[i] = k.pair(t, e)
	}
	var wg sync.WaitGroup
	for i, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			roundTrip(t, p, 64<<10+int64(i), uint64(100+i))
		}()
	}
	wg.Wait()
}

func testSlowReader(t *testing.T, e *engine.Engine, k kit) {
	slow := k.open(t, e)
	const size = 16 << 20
	// The client pushes far more than the socket buffers hold while the
	// server does not read: the relay must stall that direction only.
	werr := send(slow.Client, 7, size, true)
	// Meanwhile other relays on the same engine keep moving.
	for i := range 4 {
		roundTrip(t, k.pair(t, e), 256<<10, uint64(200+i))
	}
	// Now read slowly, in small pieces.
	want, _, _ := digest(stream(7, size))
	h := sha256.New()
	buf := make([]byte, 3000)
	var n int64
	for {
		m, err := slow.Server.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n%(1<<20) < 3000 {
			runtime.Gosched()
		}
	}
	if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("slow reader got %d bytes (want %d) or different bytes", n, size)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	slow.Server.CloseWrite()
	slow.wantClean(t)
}

func testCountersMove(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	// A multiple of the std relay's counting step (it counts each 4 MiB
	// splice when it completes).
	const chunk = 8 << 20
	werr := send(p.Client, 9, chunk, false)
	if _, err := io.CopyN(io.Discard, p.Server, chunk); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	// The relay is still open; its counter must reach what was delivered
	// (the relay adds after the kernel has moved the bytes, so wait for it).
	for stop := time.Now().Add(hang); p.Counters.AToB.Load() < chunk; {
		select {
		case r := <-p.Done:
			t.Fatalf("relay ended early: %v", r.Err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(stop) {
			break
		}
	}
	if got := p.Counters.AToB.Load(); got != chunk {
		t.Fatalf("A→B counter %d while the relay is open, want %d", got, chunk)
	}
	p.Client.CloseWrite()
	p.Server.CloseWrite()
	p.wantClean(t)
}

// testMessageSizes sends messages one at a time, each echoed before the
// next, of sizes around the points where a relay may change how it moves
// bytes (a copy buffer's size, a pipe's): small ones, then bulk, then small
// again, in both directions.
func testMessageSizes(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	go echo(p.Server)
	sizes := []int64{1, 7, 100, 4095, 16<<10 - 1, 16 << 10, 16<<10 + 1, 64 << 10, 4 << 20, 1, 3, 1000, 32<<10 + 5, 2}
	var total int64
	for i, size := range sizes {
		want, _, _ := digest(stream(uint64(300+i), size))
		werr := send(p.Client, uint64(300+i), size, false)
		got, n, err := digest(io.LimitReader(progress{p.Client}, size))
		if err != nil || n != size {
			t.Fatalf("message %d: read back %d of %d bytes: %v", i, n, size, err)
		}
		if got != want {
			t.Fatalf("message %d (%d bytes): echoed bytes differ from those sent", i, size)
		}
		if err := <-werr; err != nil {
			t.Fatalf("message %d: write: %v", i, err)
		}
		total += size
	}
	p.Client.CloseWrite()
	if rest, err := io.ReadAll(p.Client); err != nil || len(rest) != 0 {
		t.Fatalf("after the last message: %d more bytes, %v; want a clean EOF", len(rest), err)
	}
	p.wantClean(t)
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != total || b != total {
		t.Fatalf("counters A→B %d B→A %d, want %d each", a, b, total)
	}
}

// testSmallWritesSlowReader sends many small writes to a server that reads
// nothing until the socket buffers are full, so that a relay has bytes it
// read but cannot send yet; then the server reads everything, in order.
func testSmallWritesSlowReader(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	p.Client.SetNoDelay(true)
	const msg, count = 700, 12000 // 8.4 MB: far more than the buffers hold
	werr := make(chan error, 1)
	go func() {
		src := stream(11, msg*count)
		buf := make([]byte, msg)
		for range count {
			if _, err := io.ReadFull(src, buf); err != nil {
				werr <- err
				return
			}
			if _, err := p.Client.Write(buf); err != nil {
				werr <- err
				return
			}
		}
		werr <- p.Client.CloseWrite()
	}()
	// The writer blocks once the buffers are full; reading starts only
	// when it has stopped making progress.
	for last := int64(-1); ; {
		time.Sleep(20 * time.Millisecond)
		n := p.Counters.AToB.Load()
		if n == last || n == msg*count {
			break
		}
		last = n
	}
	want, _, _ := digest(stream(11, msg*count))
	got, n, err := digest(progress{p.Server})
	if err != nil || n != msg*count || got != want {
		t.Fatalf("slow reader got %d of %d bytes (%v), or different bytes", n, msg*count, err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	p.Server.CloseWrite()
	p.wantClean(t)
	if a := p.Counters.AToB.Load(); a != msg*count {
		t.Fatalf("counter A→B %d, want %d", a, msg*count)
	}
}
