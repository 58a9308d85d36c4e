package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// hboneEndpoint is an hbone.Stream as an engine.StreamEndpoint, as the
// proxy wraps it.
type hboneEndpoint struct{ *hbone.Stream }

func (s hboneEndpoint) Abort() error { return s.Stream.Reset(http2.ErrCodeCancel) }

func (s hboneEndpoint) SetWaker(w engine.Waker) {
	if w == nil {
		s.Stream.SetWaker(nil)
		return
	}
	s.Stream.SetWaker(w)
}

// sink is a Handler that reads the whole request body and answers with its
// length, as 8 bytes, once it has ended: an upload with no bytes flowing
// back meanwhile, so no incoming DATA can wake a relay that missed the
// opening of its send window.
func sink(_ context.Context, req *hbone.ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	go func() {
		defer s.Close()
		n, err := io.Copy(io.Discard, s)
		if err != nil {
			return
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(n))
		if _, err := s.Write(b[:]); err == nil {
			_ = s.CloseWrite()
		}
	}()
}

// TestHBONERelayUploads relays TCP clients to HBONE streams that share one
// TLS connection, on several loops at once, so the streams compete for the
// connection's send window and write buffer: TryWrite often takes less
// than WriteWindow promised a moment before. Only uploads flow until each
// client half-closes, so a relay that waited for a wake-up the stream
// never owed it stalls here (the suite's hang deadline fails it).
func TestHBONERelayUploads(t *testing.T) {
	srvTLS, cliTLS := hbonetest.SelfSignedTLS(t)
	tests := []struct {
		name    string
		server  hbone.Config // its windows are what the relays may send
		streams int
		size    int
	}{
		{"default windows", hbone.Config{}, 8, 1 << 20},
		{"small connection window", hbone.Config{ConnWindow: 65535}, 8, 512 << 10},
		{"small stream windows", hbone.Config{StreamWindow: 65535, ConnWindow: 1 << 20}, 8, 512 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := hbonetest.Start(t, tc.server, sink, srvTLS)
			ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
			defer cancel()
			nc, err := srv.Dial(ctx, cliTLS)
			if err != nil {
				t.Fatal(err)
			}
			cc, err := hbone.NewClientConn(nc, hbone.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			e, err := engine.New(engine.Config{Backend: engine.BackendEpoll, Loops: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			var wg sync.WaitGroup
			for i := range tc.streams {
				s, err := cc.Connect(ctx, &hbone.Request{Authority: "10.0.0.1:80"})
				if err != nil {
					t.Fatal(err)
				}
				client, a := connPair(t)
				done := make(chan engine.Result, 1)
				var counters engine.Counters
				e.Start(engine.TCPEndpoint{TCPConn: a}, hboneEndpoint{s}, &counters, func(r engine.Result) { done <- r })
				wg.Go(func() {
					if err := upload(client, uint64(i), tc.size); err != nil {
						t.Errorf("stream %d: %v (relayed %d bytes up)", i, err, counters.AToB.Load())
						return
					}
					if r := <-done; r.Err != nil {
						t.Errorf("stream %d: relay ended with %v", i, r.Err)
					}
				})
			}
			wg.Wait()
		})
	}
}

// hangLimit is the safety net on a test's blocking calls: a conforming
// relay never gets near it.
const hangLimit = 20 * time.Second

// upload sends size pseudo-random bytes in writes of random sizes, then
// half-closes and checks the 8-byte count the sink answers with.
func upload(c *net.TCPConn, seed uint64, size int) error {
	_ = c.SetDeadline(time.Now().Add(hangLimit))
	rng := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 64<<10)
	for left := size; left > 0; {
		k := min(left, 1+rng.IntN(len(buf)))
		for i := range buf[:k] {
			buf[i] = byte(rng.Uint32())
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return err
		}
		left -= k
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if len(got) != 8 || binary.BigEndian.Uint64(got) != uint64(size) {
		return fmt.Errorf("sink counted %x, want %d bytes", got, size)
	}
	return nil
}

// connPair returns both ends of a fresh loopback TCP connection.
func connPair(t *testing.T) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
