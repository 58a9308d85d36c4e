package nettest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// RoundTripTimeout bounds one RoundTrip, so a lost echo fails the test
// instead of hanging it.
const RoundTripTimeout = 10 * time.Second

// RoundTrip writes msg on c, whose far end echoes, and reads it back,
// leaving c open (and without a deadline) for the next round.
func RoundTrip(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(RoundTripTimeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// HalfCloser is a connection whose write side can end alone: a TCP
// connection, a TLS connection or an HBONE stream.
type HalfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

// prng is ChaCha8 seeded from seed, read eight bytes (one Uint64, little
// endian) at a time.
type prng struct{ r *rand.Rand }

func newPRNG(seed uint64) prng {
	return prng{rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))}
}

// Read fills p; a tail shorter than eight bytes drops the rest of its word,
// so the stream depends on the read sizes (CheckEcho's are fixed).
func (g prng) Read(p []byte) (int, error) {
	for i := 0; i < len(p); i += 8 {
		v := g.r.Uint64()
		for j := 0; j < 8 && i+j < len(p); j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	return len(p), nil
}

// CheckEcho sends n pseudo-random bytes (ChaCha8 from seed, in writes of
// writeSize; 0 means 64 KiB) on c, whose far end echoes them, half-closes,
// and reads the echo to its end while writing, comparing both directions'
// SHA-256.
func CheckEcho(c HalfCloser, n int64, seed uint64, writeSize int) error {
	if writeSize <= 0 {
		writeSize = 64 << 10
	}
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		g, buf := newPRNG(seed), make([]byte, writeSize)
		for left := n; left > 0; {
			k := int(min(left, int64(len(buf))))
			g.Read(buf[:k])
			sent.Write(buf[:k])
			if _, err := c.Write(buf[:k]); err != nil {
				werr <- fmt.Errorf("write: %w", err)
				return
			}
			left -= int64(k)
		}
		werr <- c.CloseWrite()
	}()
	got := sha256.New()
	m, rerr := io.Copy(got, c)
	if err := <-werr; err != nil {
		return err
	}
	if rerr != nil {
		return fmt.Errorf("read after %d bytes: %w", m, rerr)
	}
	if m != n || !bytes.Equal(got.Sum(nil), sent.Sum(nil)) {
		return fmt.Errorf("echo of %d bytes came back as %d bytes, sha256 %x, want %x", n, m, got.Sum(nil), sent.Sum(nil))
	}
	return nil
}

// Exchange writes payload on c and half-closes it while it reads whatever
// the far end sends until that end closes; it returns what was read and
// the read's error, else the write's. The caller sets any deadline.
func Exchange(c HalfCloser, payload []byte) ([]byte, error) {
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(c)
	werr := <-errc
	if rerr != nil {
		return got, rerr
	}
	return got, werr
}
