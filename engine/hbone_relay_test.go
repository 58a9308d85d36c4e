package engine_test

import (
	"bytes"
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
	"github.com/ztunnel-go/ztunnel/internal/nettest"
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

// TestHBONERelay relays TCP clients to HBONE streams that share one TLS
// connection, on several loops at once, so the streams compete for the
// connection's send window and write buffer: TryWrite often takes less
// than WriteWindow promised a moment before. In the upload cases nothing
// flows back until each client half-closes, so a relay that waits for a
// wake-up the stream does not owe it stalls (and hangLimit fails it); the
// echo case moves bytes both ways at once.
func TestHBONERelay(t *testing.T) {
	srvTLS, cliTLS := hbonetest.SelfSignedTLS(t)
	tests := []struct {
		name    string
		server  hbone.Config // its windows are what the relays may send
		echo    bool         // the server echoes rather than counts
		streams int
		size    int
	}{
		{"upload default windows", hbone.Config{}, false, 8, 1 << 20},
		{"upload small connection window", hbone.Config{ConnWindow: 65535}, false, 8, 512 << 10},
		{"upload small stream windows", hbone.Config{StreamWindow: 65535, ConnWindow: 1 << 20}, false, 8, 512 << 10},
		{"echo small connection window", hbone.Config{ConnWindow: 65535}, true, 8, 512 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			handler, check := hbone.Handler(sink), upload
			if tc.echo {
				handler, check = hbonetest.Echo, echoed
			}
			srv := hbonetest.Start(t, tc.server, handler, srvTLS)
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
				client, a := nettest.TCPPair(t)
				done := make(chan engine.Result, 1)
				var counters engine.Counters
				e.Start(engine.TCPEndpoint{TCPConn: a}, hboneEndpoint{s}, &counters, func(r engine.Result) { done <- r })
				wg.Go(func() {
					if err := check(client, uint64(i), tc.size); err != nil {
						t.Errorf("stream %d: %v (relayed %d bytes up, %d down)", i, err, counters.AToB.Load(), counters.BToA.Load())
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

// payload returns size pseudo-random bytes.
func payload(seed uint64, size int) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// send writes p to c in writes of random sizes, each within hangLimit, and
// half-closes.
func send(c *net.TCPConn, seed uint64, p []byte) error {
	rng := rand.New(rand.NewPCG(seed, 2))
	for len(p) > 0 {
		k := min(len(p), 1+rng.IntN(64<<10))
		_ = c.SetWriteDeadline(time.Now().Add(hangLimit))
		if _, err := c.Write(p[:k]); err != nil {
			return err
		}
		p = p[k:]
	}
	return c.CloseWrite()
}

// upload sends size bytes and checks the 8-byte count the sink answers
// with.
func upload(c *net.TCPConn, seed uint64, size int) error {
	if err := send(c, seed, payload(seed, size)); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(hangLimit))
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if len(got) != 8 || binary.BigEndian.Uint64(got) != uint64(size) {
		return fmt.Errorf("sink counted %x, want %d bytes", got, size)
	}
	return nil
}

// echoed sends size bytes while it reads their echo back, and compares.
func echoed(c *net.TCPConn, seed uint64, size int) error {
	p := payload(seed, size)
	werr := make(chan error, 1)
	go func() { werr <- send(c, seed, p) }()
	var got bytes.Buffer
	buf := make([]byte, 32<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(hangLimit))
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if err := <-werr; err != nil {
		return err
	}
	if !bytes.Equal(got.Bytes(), p) {
		return fmt.Errorf("echo of %d bytes differs from the %d sent", got.Len(), size)
	}
	return nil
}
