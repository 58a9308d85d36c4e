package hbone

import (
	"bytes"
	"io"
	"math/bits"
	"net"
	"testing"

	"golang.org/x/net/http2"
)

// bufSpy records the read buffers a driver reads into, by the address of
// their last byte (the pump reads into c.in's tail).
type bufSpy map[*byte]bool

func (b bufSpy) note(p []byte) {
	if cap(p) > 0 {
		b[&p[:cap(p)][cap(p)-1]] = true
	}
}

// spyReader is a net.Conn for the goroutine driver's fill: Read returns at
// most chunk bytes of in, then io.EOF.
type spyReader struct {
	net.Conn
	in    []byte
	chunk int
	bufs  bufSpy
}

func (r *spyReader) Read(p []byte) (int, error) {
	r.bufs.note(p)
	if len(r.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.chunk)], r.in)
	r.in = r.in[n:]
	return n, nil
}

// spyTransport is memTransport recording the buffers TryRead is given.
type spyTransport struct {
	*memTransport
	bufs bufSpy
}

func (s spyTransport) TryRead(p []byte) (int, error) {
	s.bufs.note(p)
	return s.memTransport.TryRead(p)
}

// TestReadBufferGrowth: a header block that arrives in many small reads,
// each making the pump need a little more, grows the read buffer at least
// twofold each time it is short, whichever driver reads: the buffer is
// replaced a logarithmic number of times, not once per piece (the growth
// is written once, for both drivers' reads).
func TestReadBufferGrowth(t *testing.T) {
	onceOnly(t)
	const block = 300 << 10
	var in bytes.Buffer
	fr := http2.NewFramer(&in, nil)
	_ = fr.WriteSettings()
	frag := bytes.Repeat([]byte{'a'}, 16<<10)
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: frag})
	for range block/len(frag) - 1 {
		_ = fr.WriteContinuation(1, false, frag) // never ends: no decoding
	}
	cfg := Config{MaxHeaderListSize: 1 << 20, MaxHeaderBlockSize: 1 << 20, PingInterval: -1}.withDefaults(true)
	// Small buffer, large buffer, then one per doubling up to the block.
	most := 2 + bits.Len(uint(block/inLargeSize))
	for _, tc := range []struct {
		name string
		read func(t *testing.T, in []byte, bufs bufSpy)
	}{
		{"goroutines", func(t *testing.T, in []byte, bufs bufSpy) {
			c := newConn(&spyReader{in: in, chunk: 1000, bufs: bufs}, cfg, true)
			g := c.drv.(*goDriver)
			for {
				progress, err := c.step()
				if err != nil {
					t.Fatal(err)
				}
				if !progress {
					if err := g.fill(); err != nil {
						break // io.EOF: all read
					}
				}
			}
		}},
		{"loop", func(t *testing.T, in []byte, bufs bufSpy) {
			m := &memTransport{in: in, chunk: 1000}
			c := newConn(spyTransport{m, bufs}, cfg, true)
			d := testDriven(c, &nopOwner{})
			for more := true; more; {
				var err error
				if more, err = d.Readable(); err != nil {
					t.Fatal(err)
				}
			}
			if len(m.in) != 0 {
				t.Fatalf("%d bytes left unread", len(m.in))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bufs := bufSpy{}
			tc.read(t, bytes.Clone(in.Bytes()), bufs)
			if len(bufs) > most {
				t.Fatalf("%d read buffers for a %d-byte header block read 1000 bytes at a time; want at most %d", len(bufs), block, most)
			}
		})
	}
}
