package hbone

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http2"
)

// writeSyscalls reads how many write system calls the process has made
// (syscw in /proc/self/io: write, writev and their kin, on any thread).
func writeSyscalls(b *testing.B) int64 {
	b.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Skipf("write syscall count: %v", err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no syscw in /proc/self/io: %q", data)
	return 0
}

// discardHandler reads a stream to EOF, then half-closes.
func discardHandler(_ context.Context, req *ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	go func() {
		defer s.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := s.Read(buf); err != nil {
				break
			}
		}
		_ = s.CloseWrite()
	}()
}

// BenchmarkStreamThroughput measures one stream, one direction, in 64 KiB
// writes, over loopback: our client and server over TCP and TLS, and as
// references on the same run x/net/http2 CONNECT over TLS and raw TLS.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 64 << 10
	for _, tc := range []struct {
		name string
		tp   transport
	}{{"hbone-tcp", overTCP}, {"hbone-tls", overTLS}, {"hbone-tls-record", overRecord}} {
		b.Run(tc.name, func(b *testing.B) {
			ts := startServerOver(b, Config{}, discardHandler, tc.tp)
			cc := ts.client(b, Config{})
			s, err := cc.Connect(testContext(b), &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			buf := make([]byte, size)
			b.SetBytes(size)
			b.ReportAllocs()
			w0 := writeSyscalls(b)
			for b.Loop() {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s) // wait for the server to see it all
			// Both ends run in this process: the count includes the
			// server's WINDOW_UPDATEs, so it bounds the sender's from above.
			b.ReportMetric(float64(writeSyscalls(b)-w0)/float64(b.N), "writes/64KiB")
		})
	}
	b.Run("xnet-tls", func(b *testing.B) {
		serverTLS, clientTLS := testTLS(b)
		addr, stop := startXNetServer(b, serverTLS, http.HandlerFunc(xnetDiscard))
		defer stop()
		tr := &http2.Transport{TLSClientConfig: clientTLS}
		defer tr.CloseIdleConnections()
		pr, pw := io.Pipe()
		req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Scheme: "https", Host: addr}, Host: "10.0.0.1:80", Header: http.Header{}, Body: pr}
		resp, err := tr.RoundTrip(req.WithContext(testContext(b)))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		writeEach(b, pw, size)
		_ = pw.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	})
	b.Run("raw-tls", func(b *testing.B) {
		serverTLS, clientTLS := testTLS(b)
		ln, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		done := serveOnce(ln, func(nc net.Conn) { _, _ = io.CopyBuffer(io.Discard, nc, make([]byte, 64<<10)) })
		nc, err := tls.Dial("tcp", ln.Addr().String(), clientTLS)
		if err != nil {
			b.Fatal(err)
		}
		writeEach(b, nc, size)
		_ = nc.Close()
		<-done
	})
}

// writeEach writes size bytes per op to w.
func writeEach(b *testing.B, w io.Writer, size int64) {
	buf := make([]byte, size)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// serveOnce accepts one connection on ln and runs serve on it, then closes
// it; done is closed once that is over (or the accept failed).
func serveOnce(ln net.Listener, serve func(net.Conn)) (done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		serve(nc)
	}()
	return ch
}

// BenchmarkRequestResponse measures a 1-byte ping-pong on one stream, the
// latency of a round trip through client and server, next to the same over
// plain loopback TCP.
func BenchmarkRequestResponse(b *testing.B) {
	b.Run("hbone-tcp", func(b *testing.B) { benchRequestResponse(b, overTCP) })
	b.Run("hbone-tls", func(b *testing.B) { benchRequestResponse(b, overTLS) })
	b.Run("hbone-tls-record", func(b *testing.B) { benchRequestResponse(b, overRecord) })
	b.Run("raw-tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		done := serveOnce(ln, func(nc net.Conn) { _, _ = io.Copy(nc, nc) })
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		pingPong(b, nc)
		_ = nc.Close()
		<-done
	})
}

// pingPong sends one byte per op on rw and reads its echo.
func pingPong(b *testing.B, rw io.ReadWriter) {
	buf := []byte{1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rw.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(rw, buf); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRequestResponse(b *testing.B, tp transport) {
	ts := startServerOver(b, Config{}, echoHandler, tp)
	cc := ts.client(b, Config{})
	s, err := cc.Connect(testContext(b), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pingPong(b, s)
	_ = s.CloseWrite()
	_, _ = io.Copy(io.Discard, s)
}

// BenchmarkConnect measures opening and closing a stream on a pooled
// connection.
func BenchmarkConnect(b *testing.B) {
	ts := startServer(b, Config{}, func(_ context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			return
		}
		_ = s.CloseWrite()
		var buf [1]byte
		for {
			if _, err := s.Read(buf[:]); err != nil {
				break
			}
		}
		_ = s.Close()
	}, false)
	cc := ts.client(b, Config{})
	ctx := testContext(b)
	req := &Request{Authority: "10.0.0.1:80"}
	b.ReportAllocs()
	for b.Loop() {
		s, err := cc.Connect(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		_ = s.CloseWrite()
		var buf [1]byte
		for {
			if _, err := s.Read(buf[:]); err != nil {
				break
			}
		}
		_ = s.Close()
	}
}
