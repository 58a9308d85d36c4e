package record

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Writing in fd mode: TryWrite holds what the socket refuses, keeps order
// against a lagging reader, and seals everything it took.

// TestTryWriteFDHeld: in fd mode, with a peer that does not read yet,
// TryWrite first takes everything (the socket, then held records), queues
// small writes behind the held ones, refuses (ok=false, queued=true, nothing
// sealed) a write that would overflow the held buffer, and never holds more
// than one output buffer; once the peer reads, TryFlush sends the rest and
// the peer receives every byte in order.
func TestTryWriteFDHeld(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	var sent []byte
	chunk := make([]byte, 1000)
	var behind, refused int
	for refused == 0 {
		rand.Read(chunk)
		c.wmu.Lock()
		seq, wasHeld := c.out.seq, c.unsent != nil
		c.wmu.Unlock()
		ok, queued, err := c.TryWrite(chunk)
		if err != nil {
			t.Fatal(err)
		}
		c.wmu.Lock()
		seq2, held, capHeld := c.out.seq, len(c.unsent), 0
		if c.backlog != nil {
			capHeld = cap(*c.backlog)
		}
		c.wmu.Unlock()
		if capHeld > outBufSize {
			t.Fatalf("held buffer grew to %d bytes", capHeld)
		}
		switch {
		case ok:
			sent = append(sent, chunk...)
			if wasHeld && queued {
				behind++
			}
		case queued:
			refused++
			if seq2 != seq {
				t.Fatalf("a refused TryWrite sealed %d records", seq2-seq)
			}
			if held+sealRoom(len(chunk)) <= outBufSize {
				t.Fatalf("refused with %d bytes held, room for more", held)
			}
		default:
			t.Fatal("TryWrite refused with nothing held")
		}
	}
	if behind == 0 {
		t.Fatal("no TryWrite queued behind held records")
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(sent))
		_, err := io.ReadFull(peer, b)
		if err != nil {
			b = nil
		}
		got <- b
	}()
	fdFlush(t, c, fd)
	if b := <-got; !bytes.Equal(b, sent) {
		t.Fatalf("peer read %d bytes, not the %d sent", len(b), len(sent))
	}
}

// TestTryWriteFDInterleaved is TestTryWriteInterleaved in fd mode: random
// TryWrite sizes against a crypto/tls reader that lags, waiting for
// writability only when refused; every byte arrives in order, and both the
// held and the refused paths ran.
func TestTryWriteFDInterleaved(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	const total = 8 << 20
	src := make([]byte, total)
	rand.Read(src)
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		p := make([]byte, 4096)
		for buf.Len() < total {
			n, err := peer.Read(p)
			buf.Write(p[:n])
			if err != nil {
				break
			}
			if buf.Len()%(1<<20) < 4096 {
				time.Sleep(time.Millisecond) // lag, so the socket fills
			}
		}
		got <- buf.Bytes()
	}()
	rng := newRand(1)
	var held, refused int
	for off := 0; off < total; {
		n := min(total-off, 1+rng.IntN(64<<10))
		ok, queued, err := c.TryWrite(src[off : off+n])
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ok:
			off += n
			if queued {
				held++
			}
		case queued:
			refused++
			waitFD(t, fd, unix.POLLOUT)
			if _, err := c.TryFlush(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("TryWrite refused with nothing held")
		}
	}
	fdFlush(t, c, fd)
	if b := <-got; !bytes.Equal(b, src) {
		t.Fatalf("reader got %d bytes, different from the %d written", len(b), total)
	}
	if held == 0 || refused == 0 {
		t.Fatalf("held %d times, refused %d: want both paths", held, refused)
	}
}

// TestTryWriteSealsAll: a TryWrite (or TryWriteLent) of MaxTryWrite bytes
// that also carries the KeyUpdate the peer asked for and a rekey (which
// take the room of the batch's last record) still seals all of p, blocking
// or in fd mode.
func TestTryWriteSealsAll(t *testing.T) {
	for _, tc := range []struct {
		name         string
		fdMode, lent bool
	}{{"blocking", false, false}, {"fd", true, false}, {"blocking-lent", false, true}, {"fd-lent", true, true}} {
		fdMode := tc.fdMode
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			fd := -1
			if fdMode {
				fd = detachFD(t, c)
			}
			p := make([]byte, MaxTryWrite, MaxTryWrite+1) // lent: every record sealed in place
			rand.Read(p)
			got := make(chan []byte, 1)
			go func() {
				b, err := io.ReadAll(srv)
				if err != nil {
					b = nil // a lost record fails the next one's authentication
				}
				got <- b
			}()
			// After the peer's KeyUpdate the sequence restarts at 0: one
			// rekey is due before the batch's ninth record.
			old := rekeyAfter
			rekeyAfter = 8
			t.Cleanup(func() { rekeyAfter = old })
			c.pendingKeyUpdate.Store(true)
			write := c.TryWrite
			if tc.lent {
				write = c.TryWriteLent
			}
			ok, queued, err := write(p)
			if !ok || err != nil {
				t.Fatalf("TryWrite = %v, %v, %v", ok, queued, err)
			}
			// Then close_notify, so that the peer's read ends.
			if b := closeAndRead(t, c, fd, fdMode, got); !bytes.Equal(b, p) {
				t.Fatalf("peer read %d bytes, not the %d TryWrite took", len(b), len(p))
			}
		})
	}
}

// TestTryWriteLent: TryWriteLent and WriteLent seal straight from the
// caller's buffer, borrowing the byte after each record's content for its
// type byte, and give every byte back: after each call the whole buffer
// (p, the bytes after it, and the capacity beyond) is as before, and a
// crypto/tls peer reads exactly what was written. Sizes around the record
// boundary, p inside a larger buffer (the byte after it is the next
// batch's) and p ending at its capacity (the last record is copied);
// TryWriteLent blocking and in fd mode, WriteLent with sizes up to twice
// what one output buffer takes.
func TestTryWriteLent(t *testing.T) {
	for _, mode := range []string{"blocking", "fd", "WriteLent"} {
		t.Run(mode, func(t *testing.T) {
			fdMode := mode == "fd"
			sizes := []int{1, maxPlaintext - 1, maxPlaintext, maxPlaintext + 1, 3*maxPlaintext + 5, MaxTryWrite}
			if mode == "WriteLent" {
				sizes = append(sizes, 2*MaxTryWrite+3)
			}
			cli, srv := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			fd := -1
			if fdMode {
				fd = detachFD(t, c)
			}
			var sent []byte
			write := func(p []byte) {
				t.Helper()
				if mode == "WriteLent" {
					if n, err := c.WriteLent(p); n != len(p) || err != nil {
						t.Fatalf("WriteLent(%d bytes) = %d, %v", len(p), n, err)
					}
					sent = append(sent, p...)
					return
				}
				ok, queued, err := c.TryWriteLent(p)
				if !ok || err != nil {
					t.Fatalf("TryWriteLent(%d bytes) = %v, %v, %v", len(p), ok, queued, err)
				}
				sent = append(sent, p...)
				if !queued {
					return
				}
				if fdMode {
					fdFlush(t, c, fd)
				} else if err := c.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			got := make(chan []byte, 1)
			go func() {
				b, err := io.ReadAll(srv)
				if err != nil {
					b = nil // a bad record fails its authentication
				}
				got <- b
			}()
			for _, n := range sizes {
				for _, atCap := range []bool{false, true} {
					buf := make([]byte, n+64, n+128)
					rand.Read(buf[:cap(buf)])
					before := bytes.Clone(buf[:cap(buf)])
					p := buf[:n]
					if atCap {
						p = buf[:n:n]
					}
					write(p)
					if after := buf[:cap(buf)]; !bytes.Equal(after, before) {
						i := 0
						for after[i] == before[i] {
							i++
						}
						t.Fatalf("%d bytes (at cap %v): byte %d changed from %#x to %#x", n, atCap, i, before[i], after[i])
					}
				}
			}
			if b := closeAndRead(t, c, fd, fdMode, got); !bytes.Equal(b, sent) {
				t.Fatalf("peer read %d bytes, not the %d written", len(b), len(sent))
			}
		})
	}
}

// closeAndRead sends close_notify (TryClose on the descriptor's readiness
// in fdMode, Close otherwise) and returns what the peer read until it.
func closeAndRead(t *testing.T, c *Conn, fd int, fdMode bool, got <-chan []byte) []byte {
	t.Helper()
	if fdMode {
		for !c.TryClose() {
			waitFD(t, fd, unix.POLLOUT)
		}
	} else if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return <-got
}
