package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Hostile peers against the server, over real TLS 1.3. Every case runs next
// to a healthy client connection on the same server and checks, besides the
// RFC 9113 answer to the attack, that the healthy connection's stream and a
// new stream still work afterwards, that the server's queued frames stayed
// bounded while the attacker did not read, and that no goroutine outlives
// the case.

// hostileAuthority marks the attacker's requests, so handlers can count them.
const hostileAuthority = "10.6.6.6:666"

// hostileRig is a TLS server with a healthy client connected.
type hostileRig struct {
	ts       *testServer
	cfg      Config
	attacked atomic.Int64 // handler calls for hostileAuthority
	healthy  *ClientConn
	stream   *Stream // opened before the attack, echoing

	peakMu sync.Mutex // guards peak
	peak   int        // largest pending write buffer seen on any connection
}

// startHostile serves cfg with h (echoHandler when nil) over TLS, with small
// socket send buffers so that a peer that stops reading makes frames queue
// in the server rather than in the kernel, and connects the healthy client.
func startHostile(t *testing.T, cfg Config, h Handler) *hostileRig {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last
	if h == nil {
		h = echoHandler
	}
	r := &hostileRig{}
	cfg.Logf = t.Logf // the server's reasons for cutting peers off
	handler := func(ctx context.Context, req *ServerRequest) {
		if req.Authority != hostileAuthority {
			echoHandler(ctx, req) // the healthy client
			return
		}
		r.attacked.Add(1)
		h(ctx, req)
	}
	r.ts = startServerWith(t, cfg, handler, overTLS, func(nc net.Conn) {
		_ = nc.(*net.TCPConn).SetWriteBuffer(16 << 10)
	})
	r.cfg = r.ts.Server.cfg
	r.healthy = r.ts.client(t, Config{})
	s, err := r.healthy.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.stream = s
	echoOnce(t, s, "healthy stream")
	return r
}

// checkHealthy checks the stream opened before the attack and a new one.
func (r *hostileRig) checkHealthy(t *testing.T) {
	t.Helper()
	echoOnce(t, r.stream, "healthy stream")
	s, err := r.healthy.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatalf("healthy connection: new stream: %v", err)
	}
	defer s.Close()
	echoOnce(t, s, "healthy stream")
}

// sample records the largest write backlog of any server connection until
// stop is called (or the test ends, before its goroutine check).
func (r *hostileRig) sample(t *testing.T) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			r.ts.Server.mu.Lock()
			conns := make([]*conn, 0, len(r.ts.Server.conns))
			for c := range r.ts.Server.conns {
				conns = append(conns, c)
			}
			r.ts.Server.mu.Unlock()
			for _, c := range conns {
				c.wmu.Lock()
				n := c.pendingLenLocked()
				c.wmu.Unlock()
				r.peakMu.Lock()
				r.peak = max(r.peak, n)
				r.peakMu.Unlock()
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(done) })
		wg.Wait()
		r.peakMu.Lock()
		defer r.peakMu.Unlock()
		return r.peak
	}
	t.Cleanup(func() { stop() })
	return stop
}

// attacker dials the rig as a raw HTTP/2 client with a tiny receive buffer.
func (r *hostileRig) attacker(t *testing.T, settings ...http2.Setting) *rawPeer {
	t.Helper()
	ctx := testContext(t)
	// The receive buffer is set before the handshake: shrunk on an open
	// connection, below the window already advertised, the kernel drops
	// what arrives beyond it, ACKs to the attacker's own flood included,
	// and both ends can sit in retransmission backoff (RTO 52 s seen)
	// with the flood stopped short of the server's bound.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	raw, err := d.DialContext(ctx, "tcp", r.ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, r.ts.tlsClient)
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	return newRawPeer(t, tc, true, settings...)
}

// flood writes n frames made by frame, batched into large writes, on a
// goroutine, without reading. wait returns how many were written before
// the connection failed (or n).
func flood(p *rawPeer, n int, frame func(fr *http2.Framer, i int)) (wait func() int) {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	fr.AllowIllegalWrites = true
	sent := make(chan int, 1)
	go func() {
		written := 0
		for i := range n {
			frame(fr, i)
			if buf.Len() >= 32<<10 || i == n-1 {
				if _, err := p.nc.Write(buf.Bytes()); err != nil {
					break
				}
				buf.Reset()
				written = i + 1
			}
		}
		sent <- written
	}()
	return func() int { return <-sent }
}

// headerBlock HPACK-encodes name/value pairs with the attacker's encoder.
func (p *rawPeer) headerBlock(kv ...string) []byte {
	p.hbuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		_ = p.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(p.hbuf.Bytes())
}

// serveErr waits for the attacker's ServeConn to return.
func (r *hostileRig) serveErr(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.ts.serveErrs:
		return err
	case <-testContext(t).Done():
		// A hang here is the server's (the reader waiting on something
		// the attacker controls): show every goroutine where it waits.
		var stacks bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("the attacked connection did not end; goroutines:\n%s", stacks.String())
		return nil
	}
}

// expectConnError checks the code the server sent GOAWAY with.
func expectConnError(t *testing.T, err error, code http2.ErrCode) {
	t.Helper()
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("ServeConn: %v, want a connection error %v", err, code)
	}
}

// drainForGoAway reads what the server still sends; if a GOAWAY arrives it
// must carry code. A peer that did not read may find the connection closed
// before the GOAWAY (the server bounds its final flush); the server's own
// verdict is checked through ServeConn.
func drainForGoAway(t *testing.T, p *rawPeer, code http2.ErrCode) {
	t.Helper()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			t.Logf("connection ended without a GOAWAY read: %v", err)
			return
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != code {
				t.Fatalf("GOAWAY %v, want %v", ga.ErrCode, code)
			}
			return
		}
	}
}

// pingAlive checks that the attacker's connection still answers a PING,
// without a GOAWAY before it.
func pingAlive(t *testing.T, p *rawPeer) {
	t.Helper()
	data := [8]byte{'a', 'l', 'i', 'v', 'e'}
	if err := p.fr.WritePing(false, data); err != nil {
		t.Fatalf("PING: %v", err)
	}
	for {
		f := p.next()
		switch f := f.(type) {
		case nil:
			t.Fatal("connection closed; want it alive")
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v; want the connection alive", f.ErrCode)
		case *http2.PingFrame:
			if f.IsAck() && f.Data == data {
				return
			}
		}
	}
}

// backlogBound is what a connection may queue while its peer does not read:
// the control backlog limit, one write buffer of data, and one frame that
// crosses the limit.
func backlogBound(cfg Config) int {
	return int(cfg.MaxControlBacklog) + writeBufCap + 64<<10
}
