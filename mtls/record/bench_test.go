package record

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

const benchSize = 256 << 10

// gatherConn gathers writes: between begin and end they accumulate and
// leave in one socket write (what crypto/tls needs to match one record
// Write per batch).
type gatherConn struct {
	net.Conn
	batching bool
	buf      []byte
}

func (g *gatherConn) Write(p []byte) (int, error) {
	if !g.batching {
		return g.Conn.Write(p)
	}
	g.buf = append(g.buf, p...)
	return len(p), nil
}

func (g *gatherConn) end() error {
	g.batching = false
	_, err := g.Conn.Write(g.buf)
	g.buf = g.buf[:0]
	return err
}

// BenchmarkWrite writes 256 KiB per op through each record layer to a
// peer that discards the raw bytes.
func BenchmarkWrite(b *testing.B) {
	for _, tc := range writeCases {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			cr, sr := nettest.TCPPair(b)
			cli, g := tc.client(cr, ccfg)
			handshakePair(b, cli, tls.Server(sr, scfg))
			done := make(chan struct{})
			go func() {
				defer close(done)
				io.Copy(io.Discard, sr)
			}()
			benchWrites(b, cli, g)
			b.StopTimer()
			cr.Close()
			<-done
		})
	}
}

// writeCase is one record layer a write benchmark measures.
type writeCase struct {
	name   string
	gather bool // crypto/tls writing through a gatherConn
	ours   bool
}

var writeCases = []writeCase{
	{"record", false, true},
	{"tls", false, false},
	{"tls+gather", true, false},
}

// client wraps raw as the case's client end; g is its gatherConn, if any.
func (tc writeCase) client(raw net.Conn, cfg *tls.Config) (cli endpoint, g *gatherConn) {
	switch {
	case tc.ours:
		return Client(raw, cfg), nil
	case tc.gather:
		g = &gatherConn{Conn: raw}
		return tls.Client(g, cfg), g
	}
	return tls.Client(raw, cfg), nil
}

// benchWrites writes benchSize bytes per op through cli, each write one
// batch of g if not nil.
func benchWrites(b *testing.B, cli endpoint, g *gatherConn) {
	p := make([]byte, benchSize)
	b.SetBytes(benchSize)
	b.ReportAllocs()
	for b.Loop() {
		if g != nil {
			g.batching = true
		}
		if _, err := cli.Write(p); err != nil {
			b.Fatal(err)
		}
		if g != nil {
			if err := g.end(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// readCases are the record layers a read benchmark measures.
var readCases = []struct {
	name string
	ours bool
}{
	{"record", true},
	{"tls", false},
}

// BenchmarkRead reads 256 KiB per op through each record layer from a
// crypto/tls peer that writes as fast as it can.
func BenchmarkRead(b *testing.B) {
	for _, tc := range readCases {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			cr, sr := nettest.TCPPair(b)
			var cli endpoint = tls.Client(cr, ccfg)
			if tc.ours {
				cli = Client(cr, ccfg)
			}
			srv := tls.Server(&gatherConn{Conn: sr}, scfg)
			handshakePair(b, cli, srv)
			done := make(chan struct{})
			go func() {
				defer close(done)
				p := make([]byte, benchSize)
				for {
					if _, err := srv.Write(p); err != nil {
						return
					}
				}
			}()
			p := make([]byte, benchSize)
			b.SetBytes(benchSize)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := io.ReadFull(cli, p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cr.Close()
			sr.Close()
			<-done
		})
	}
}

// memConn passes through to the socket until cut, then reads from src and
// discards writes: the record layers above it then run without the
// kernel, so the benchmarks below measure only their own work.
type memConn struct {
	net.Conn
	cut bool
	src []byte
}

func (m *memConn) Read(p []byte) (int, error) {
	if !m.cut {
		return m.Conn.Read(p)
	}
	if len(m.src) == 0 {
		return 0, io.EOF
	}
	n := copy(p, m.src)
	m.src = m.src[n:]
	return n, nil
}

func (m *memConn) Write(p []byte) (int, error) {
	if !m.cut {
		return m.Conn.Write(p)
	}
	return len(p), nil
}

// BenchmarkSealOnly is BenchmarkWrite without the socket: 256 KiB per op
// through each record layer into a connection that drops the bytes.
func BenchmarkSealOnly(b *testing.B) {
	for _, tc := range writeCases {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			cr, sr := nettest.TCPPair(b)
			m := &memConn{Conn: cr}
			cli, g := tc.client(m, ccfg)
			handshakePair(b, cli, tls.Server(sr, scfg))
			m.cut = true
			benchWrites(b, cli, g)
		})
	}
}

// BenchmarkOpenOnly is BenchmarkRead without the socket: each op, 256 KiB
// of records sealed with the session's keys (outside the timer) are read
// through each record layer.
func BenchmarkOpenOnly(b *testing.B) {
	for _, tc := range readCases {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			kl := &keyLog{}
			ccfg.KeyLogWriter = kl
			cr, sr := nettest.TCPPair(b)
			m := &memConn{Conn: cr}
			var cli endpoint = tls.Client(m, ccfg)
			if tc.ours {
				cli = Client(m, ccfg)
			}
			handshakePair(b, cli, tls.Server(sr, scfg))
			m.cut = true
			s, ok := suiteByID(cli.(interface{ ConnectionState() tls.ConnectionState }).ConnectionState().CipherSuite)
			if !ok {
				b.Skip("suite not ours")
			}
			peer := establishedWith(b, m, s, kl.client, kl.server)
			p := make([]byte, benchSize)
			var stream []byte
			b.SetBytes(benchSize)
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				stream = stream[:0]
				for i := 0; i < benchSize; i += maxPlaintext {
					var err error
					if stream, err = peer.appendRecordLocked(stream, typeApplicationData, p[i:i+maxPlaintext]); err != nil {
						b.Fatal(err)
					}
				}
				m.src = stream
				b.StartTimer()
				if _, err := io.ReadFull(cli, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSealBatch seals one loop write turn's worth (128 KiB, what the
// HBONE loop driver gives TryWrite at most) into an output buffer, without
// a socket: "copy" copies each record's content behind its header and
// seals it in place (TryWrite), "lent" seals it straight from the caller's
// buffer (TryWriteLent). The difference is the copy's cost per byte.
func BenchmarkSealBatch(b *testing.B) {
	const size = 128 << 10
	for _, lent := range []bool{false, true} {
		name := "copy"
		if lent {
			name = "lent"
		}
		b.Run(name, func(b *testing.B) {
			s, _ := suiteByID(tls.TLS_AES_128_GCM_SHA256)
			c := establishedWith(b, nil, s, make([]byte, 32), make([]byte, 32))
			// The HBONE write buffer the batch comes from: the batch is
			// its first half, so the byte after it is in p's capacity.
			src := make([]byte, 2*size)
			p := src[:size]
			out := make([]byte, 0, outBufSize)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := c.sealAllLocked(out[:0], p, lent)
				if err != nil {
					b.Fatal(err)
				}
				out = buf
			}
		})
	}
}
