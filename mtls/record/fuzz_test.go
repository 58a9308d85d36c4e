package record

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// streamConn is a net.Conn that reads a fixed byte stream in chunks of the
// given sizes (cycled) and discards writes.
type streamConn struct {
	net.Conn // nil: only the methods below are called
	r        *bytes.Reader
	chunks   []byte
	i        int
}

func (s *streamConn) Read(p []byte) (int, error) {
	if len(s.chunks) > 0 {
		k := int(s.chunks[s.i%len(s.chunks)]) + 1
		s.i++
		if len(p) > k {
			p = p[:k]
		}
	}
	return s.r.Read(p)
}

func (s *streamConn) Write(p []byte) (int, error)      { return len(p), nil }
func (s *streamConn) Close() error                     { return nil }
func (s *streamConn) SetWriteDeadline(time.Time) error { return nil }

// established returns a Conn over raw whose handshake is deemed done, with
// fixed secrets: what one end writes, the other reads.
func established(t testing.TB, raw net.Conn, id uint16, client bool) *Conn {
	t.Helper()
	s, ok := suiteByID(id)
	if !ok {
		t.Fatalf("suite %#x", id)
	}
	cs := bytes.Repeat([]byte{0xc1}, s.hash().Size())
	ss := bytes.Repeat([]byte{0x5e}, s.hash().Size())
	if !client {
		cs, ss = ss, cs
	}
	c := establishedWith(t, raw, s, ss, cs)
	c.isClient = client
	return c
}

// establishedWith returns a Conn over raw whose handshake is deemed done,
// reading with readSecret and writing with writeSecret.
func establishedWith(t testing.TB, raw net.Conn, s suite, readSecret, writeSecret []byte) *Conn {
	t.Helper()
	c := &Conn{raw: raw}
	ss, cs := bytes.Clone(readSecret), bytes.Clone(writeSecret)
	if err := c.in.setSecret(s, ss); err != nil {
		t.Fatal(err)
	}
	if err := c.out.setSecret(s, cs); err != nil {
		t.Fatal(err)
	}
	c.hsDone.Store(true)
	return c
}

// fuzzStream turns the fuzzer's script into wire bytes: each step is
// [type][len][content...]; type 0xff adds the content raw (unprotected),
// any other type seals content under it (a KeyUpdate message moves the
// writer's keys, as the real writer would). Whatever is left is appended
// raw.
func fuzzStream(t testing.TB, w *Conn, script []byte) []byte {
	var out []byte
	for len(script) >= 2 {
		typ, n := script[0], int(script[1])
		script = script[2:]
		n = min(n, len(script))
		content := script[:n]
		script = script[n:]
		if typ == 0xff {
			out = append(out, content...)
			continue
		}
		out = append(out, sealed(t, w, typ, content)...)
		if typ == typeHandshake && len(content) >= 5 && content[len(content)-5] == hsKeyUpdate &&
			bytes.Equal(content[len(content)-4:len(content)-1], []byte{0, 0, 1}) {
			if err := w.out.update(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return append(out, script...)
}

// FuzzRead feeds a scripted mix of sealed and raw records, in arbitrary
// socket chunks, to the read side with arbitrary Read sizes: it must end
// with io.EOF, io.ErrUnexpectedEOF, a *ProtocolError or an AlertError, and
// never return more bytes than it was given.
func FuzzRead(f *testing.F) {
	data := func(s string) []byte { return append([]byte{typeApplicationData, byte(len(s))}, s...) }
	closeNotify := []byte{typeAlert, 2, 1, 0}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	fuzzseed.Add(f, cat(data("hello"), closeNotify), []byte{}, uint16(100), false)
	fuzzseed.Add(f, cat(data("hello"), data(""), data("world")), []byte{3, 200, 0}, uint16(3), true)
	fuzzseed.Add(f, cat([]byte{typeHandshake, 5, hsKeyUpdate, 0, 0, 1, 1}, data("after update"), closeNotify), []byte{7}, uint16(16), false)
	fuzzseed.Add(f, cat([]byte{typeHandshake, 6, hsNewSessionTicket, 0, 0, 4, 1, 2}, []byte{typeHandshake, 2, 3, 4}, data("x")), []byte{}, uint16(1), false)
	fuzzseed.Add(f, cat(data("abc"), []byte{0xff, 7, typeApplicationData, 3, 3, 0x41, 0x01, 0, 0}), []byte{1, 2}, uint16(5), true)
	fuzzseed.Add(f, cat(data("abc"), []byte{typeAlert, 2, 2, 40}), []byte{}, uint16(64), false)
	fuzzseed.Add(f, cat(data("pad\x17\x00\x00"), []byte{0, 0}), []byte{}, uint16(2), false)
	fuzzseed.Add(f, []byte{typeApplicationData, 3, 3, 0, 200, 1, 2, 3}, []byte{}, uint16(10), false)
	f.Fuzz(func(t *testing.T, script, chunks []byte, readSize uint16, aes256 bool) {
		id := tls.TLS_AES_128_GCM_SHA256
		if aes256 {
			id = tls.TLS_AES_256_GCM_SHA384
		}
		// The server writes and the client reads: a client may receive
		// every post-handshake message a server sends (tickets too).
		w := established(t, &streamConn{r: bytes.NewReader(nil)}, id, false)
		stream := fuzzStream(t, w, script)
		r := established(t, &streamConn{r: bytes.NewReader(stream), chunks: chunks}, id, true)
		p := make([]byte, int(readSize)+1)
		total := 0
		for range len(stream) + 2 {
			n, err := r.Read(p)
			total += n
			if total > len(stream) {
				t.Fatalf("read %d bytes from a stream of %d", total, len(stream))
			}
			if err == nil {
				continue
			}
			var pe *ProtocolError
			var ae AlertError
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &pe) && !errors.As(err, &ae) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		t.Fatal("reads did not end")
	})
}

// TestSuites round-trips data between two established ends for each suite
// the record layer protects (crypto/tls gives no way to negotiate
// AES-256-GCM against it, so this is where that suite's key schedule runs).
func TestSuites(t *testing.T) {
	for _, id := range []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384} {
		t.Run(tls.CipherSuiteName(id), func(t *testing.T) {
			cr, sr := nettest.TCPPair(t)
			cli, srv := established(t, cr, id, true), established(t, sr, id, false)
			if err := cli.KeyUpdate(true); err != nil {
				t.Fatal(err)
			}
			exchange(t, cli, srv, 100000)
			if err := srv.KeyUpdate(false); err != nil {
				t.Fatal(err)
			}
			exchange(t, cli, srv, 100000)
		})
	}
}

// TestSuiteUnsupported: the suites crypto/tls keeps.
func TestSuiteUnsupported(t *testing.T) {
	if _, ok := suiteByID(tls.TLS_CHACHA20_POLY1305_SHA256); ok {
		t.Fatal("ChaCha20-Poly1305 is not ours to protect")
	}
}
