package record

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

const benchSize = 256 << 10

// gatherConn imitates hbone.NewBatchConn: between begin and end, writes
// accumulate and leave in one socket write.
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
	for _, tc := range []struct {
		name   string
		gather bool
		ours   bool
	}{
		{"record", false, true},
		{"tls", false, false},
		{"tls+gather", true, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			cr, sr := tcpPair(b)
			var cli endpoint
			var g *gatherConn
			switch {
			case tc.ours:
				cli = Client(cr, ccfg)
			case tc.gather:
				g = &gatherConn{Conn: cr}
				cli = tls.Client(g, ccfg)
			default:
				cli = tls.Client(cr, ccfg)
			}
			handshakePair(b, cli, tls.Server(sr, scfg))
			done := make(chan struct{})
			go func() {
				defer close(done)
				io.Copy(io.Discard, sr)
			}()
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
			b.StopTimer()
			cr.Close()
			<-done
		})
	}
}

// BenchmarkRead reads 256 KiB per op through each record layer from a
// crypto/tls peer that writes as fast as it can.
func BenchmarkRead(b *testing.B) {
	for _, tc := range []struct {
		name string
		ours bool
	}{
		{"record", true},
		{"tls", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ccfg, scfg := testConfigs(b)
			cr, sr := tcpPair(b)
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
