package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, clientTLS := testTLS(t)
	r.ts = &testServer{Server: NewServer(cfg, handler), addr: ln.Addr().String(), tlsClient: clientTLS, serveErrs: make(chan error, 100)}
	r.cfg = r.ts.Server.cfg
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_ = nc.(*net.TCPConn).SetWriteBuffer(16 << 10)
			wg.Go(func() {
				tc := tls.Server(nc, serverTLS)
				if err := tc.HandshakeContext(context.Background()); err != nil {
					_ = nc.Close()
					return
				}
				err := r.ts.ServeConn(context.Background(), tc)
				select {
				case r.ts.serveErrs <- err:
				default:
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		_ = r.ts.Close()
		wg.Wait()
	})
	r.healthy = r.ts.client(t, Config{})
	s, err := r.healthy.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.stream = s
	r.echo(t, s)
	return r
}

// echo checks one round trip on s.
func (r *hostileRig) echo(t *testing.T, s *Stream) {
	t.Helper()
	msg := []byte("still here")
	if _, err := s.Write(msg); err != nil {
		t.Fatalf("healthy stream write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("healthy stream read %q, %v", got, err)
	}
}

// checkHealthy checks the stream opened before the attack and a new one.
func (r *hostileRig) checkHealthy(t *testing.T) {
	t.Helper()
	r.echo(t, r.stream)
	s, err := r.healthy.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatalf("healthy connection: new stream: %v", err)
	}
	defer s.Close()
	r.echo(t, s)
}

// sample records the largest write backlog of any server connection until
// stop is called.
func (r *hostileRig) sample() (stop func() int) {
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
	return func() int {
		close(done)
		wg.Wait()
		r.peakMu.Lock()
		defer r.peakMu.Unlock()
		return r.peak
	}
}

// attacker dials the rig as a raw HTTP/2 client with a tiny receive buffer.
func (r *hostileRig) attacker(t *testing.T, settings ...http2.Setting) *rawPeer {
	t.Helper()
	ctx := testContext(t)
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", r.ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = raw.(*net.TCPConn).SetReadBuffer(4 << 10)
	tc := tls.Client(raw, r.ts.tlsClient)
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(testTimeout))
	p := &rawPeer{t: t, nc: tc, fr: http2.NewFramer(tc, tc)}
	p.enc = hpack.NewEncoder(&p.hbuf)
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.fr.AllowIllegalWrites = true
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := p.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return p
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
		t.Fatal("the attacked connection did not end")
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

func TestHostileRapidReset(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		// slow handlers never notice the resets.
		slow bool
	}{
		{name: "default budget", cfg: Config{}},
		{name: "small budget", cfg: Config{MaxResetStreams: 50}},
		{name: "slow handlers", cfg: Config{MaxResetStreams: 50, MaxStreams: 10}, slow: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var h Handler
			if tc.slow {
				h = func(ctx context.Context, req *ServerRequest) {
					if req.Authority == hostileAuthority {
						<-release
					}
					echoHandler(ctx, req)
				}
			}
			r := startHostile(t, tc.cfg, h)
			var releaseOnce sync.Once
			unblock := func() { releaseOnce.Do(func() { close(release) }) }
			defer unblock()
			p := r.attacker(t)
			block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
			const streams = 100_000
			stop := r.sample()
			sent := flood(p, streams, func(fr *http2.Framer, i int) {
				id := uint32(2*i + 1)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
				_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
			})
			drainForGoAway(t, p, http2.ErrCodeEnhanceYourCalm)
			// ServeConn returns once the connection's handlers have.
			unblock()
			expectConnError(t, r.serveErr(t), http2.ErrCodeEnhanceYourCalm)
			_ = p.nc.Close()
			n := sent()
			peak := stop()
			budget := int64(r.cfg.MaxResetStreams)
			// Each reset stream ran at most one handler, and the connection
			// ended once the budget (plus what refilled meanwhile, and the
			// streams refused at the handler cap) was spent.
			// A stream the handler answered before the reset arrived does
			// not count, so the bound allows for some of those.
			got := r.attacked.Load()
			if got > 4*budget+2*int64(r.cfg.MaxStreams) {
				t.Errorf("%d handlers ran for reset streams, budget %d", got, budget)
			}
			t.Logf("%d of %d streams reached a handler before the GOAWAY", got, n)
			if n == streams {
				t.Logf("attacker wrote all %d streams before the connection ended", n)
			}
			if peak > backlogBound(r.cfg) {
				t.Errorf("write backlog peaked at %d bytes, bound %d", peak, backlogBound(r.cfg))
			}
			r.checkHealthy(t)
		})
	}
}

// TestHostileFloods: frames that cost the attacker little, sent by a peer
// that does not read, or that break a limit by accumulation.
func TestHostileFloods(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		settings []http2.Setting
		n        int
		frame    func(p *rawPeer) func(fr *http2.Framer, i int)
		code     http2.ErrCode // GOAWAY code; 0: the connection survives
	}{
		{
			name: "PING flood without reading",
			n:    500_000,
			frame: func(*rawPeer) func(*http2.Framer, int) {
				return func(fr *http2.Framer, i int) { _ = fr.WritePing(false, [8]byte{byte(i)}) }
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "SETTINGS flood without reading",
			// Enough that the server's answers (9-byte ACKs) exceed any
			// socket buffering the kernel may autotune (several MiB each
			// way) and so must reach the write-backlog bound: with fewer,
			// a flood could be absorbed whole and never trip it.
			n: 1_500_000,
			frame: func(*rawPeer) func(*http2.Framer, int) {
				return func(fr *http2.Framer, _ int) {
					_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "streams beyond the limit without reading",
			cfg:  Config{MaxStreams: 2, MaxResetStreams: 1 << 30},
			n:    600_000, // 13-byte RST_STREAMs: more than the kernel can buffer (see the SETTINGS flood)
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				return func(fr *http2.Framer, i int) {
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true})
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "streams beyond the limit, reset budget",
			cfg:  Config{MaxStreams: 2, MaxResetStreams: 100},
			n:    100_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				return func(fr *http2.Framer, i int) {
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true})
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "malformed requests without reading",
			cfg:  Config{MaxResetStreams: 1 << 30},
			n:    200_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
				return func(fr *http2.Framer, i int) {
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true})
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "empty CONTINUATION flood",
			n:    1_000_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				return func(fr *http2.Framer, i int) {
					if i == 0 {
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block})
						return
					}
					_ = fr.WriteContinuation(1, false, nil)
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "endless CONTINUATION of header fields",
			n:    100_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				start := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				var more bytes.Buffer
				enc := hpack.NewEncoder(&more)
				_ = enc.WriteField(hpack.HeaderField{Name: "x-junk", Value: strings.Repeat("j", 1000), Sensitive: true})
				field := more.Bytes()
				return func(fr *http2.Framer, i int) {
					if i == 0 {
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: start})
						return
					}
					_ = fr.WriteContinuation(1, false, field)
				}
			},
			// The framer stops decoding once the list limit is exceeded.
			code: http2.ErrCodeProtocol,
		},
		{
			name: "header block larger than the wire budget",
			cfg:  Config{MaxHeaderListSize: 1 << 20, MaxHeaderBlockSize: 32 << 10},
			n:    100,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				start := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				var more bytes.Buffer
				enc := hpack.NewEncoder(&more)
				_ = enc.WriteField(hpack.HeaderField{Name: "x-junk", Value: strings.Repeat("j", 1000), Sensitive: true})
				field := more.Bytes()
				return func(fr *http2.Framer, i int) {
					if i == 0 {
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: start})
						return
					}
					_ = fr.WriteContinuation(1, false, field)
				}
			},
			code: http2.ErrCodeEnhanceYourCalm,
		},
		{
			name: "connection WINDOW_UPDATE flood to overflow",
			n:    1 << 16,
			frame: func(*rawPeer) func(*http2.Framer, int) {
				return func(fr *http2.Framer, _ int) { _ = fr.WriteWindowUpdate(0, 1<<20) }
			},
			code: http2.ErrCodeFlowControl,
		},
		{
			name: "WINDOW_UPDATE flood on closed streams",
			n:    100_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				return func(fr *http2.Framer, i int) {
					if i == 0 {
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true})
						_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
						return
					}
					_ = fr.WriteWindowUpdate(1, 1)
				}
			},
		},
		{
			name: "PRIORITY and unknown frame flood",
			n:    200_000,
			frame: func(*rawPeer) func(*http2.Framer, int) {
				return func(fr *http2.Framer, i int) {
					if i%2 == 0 {
						_ = fr.WritePriority(uint32(2*i+1), http2.PriorityParam{StreamDep: 0, Weight: 1})
					} else {
						_ = fr.WriteRawFrame(0x42, 0, 0, []byte("hello"))
					}
				}
			},
		},
		{
			name: "empty DATA flood on an open stream",
			n:    200_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
				return func(fr *http2.Framer, i int) {
					if i == 0 {
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true})
						return
					}
					_ = fr.WriteData(1, false, nil)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHostile(t, tc.cfg, holdHandler)
			p := r.attacker(t, tc.settings...)
			stop := r.sample()
			sent := flood(p, tc.n, tc.frame(p))
			if tc.code == 0 {
				if n := sent(); n != tc.n {
					t.Fatalf("flood stopped after %d of %d frames", n, tc.n)
				}
				pingAlive(t, p)
				if peak := stop(); peak > backlogBound(r.cfg) {
					t.Errorf("write backlog peaked at %d bytes, bound %d", peak, backlogBound(r.cfg))
				}
				r.checkHealthy(t)
				return
			}
			// The attacker reads only once the server has given up on it.

			err := r.serveErr(t)
			drainForGoAway(t, p, tc.code)
			_ = p.nc.Close()
			sent()
			peak := stop()
			expectConnError(t, err, tc.code)
			if peak > backlogBound(r.cfg) {
				t.Errorf("write backlog peaked at %d bytes, bound %d", peak, backlogBound(r.cfg))
			}
			r.checkHealthy(t)
		})
	}
}

// TestHostileStalls: a peer that never opens its flow-control windows or
// stops reading altogether holds no more than the windows' worth of buffers,
// and its handler is released when the connection ends.
func TestHostileStalls(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		settings []http2.Setting
		// readTCP: the peer keeps reading frames (but never returns window).
		readTCP bool
		want    error // what the handler's Write finally fails with
	}{
		{
			name:     "zero stream window",
			settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}},
			readTCP:  true,
			want:     ErrConnClosed,
		},
		{
			name:     "connection window never returned",
			settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 1 << 30}},
			readTCP:  true,
			want:     ErrConnClosed,
		},
		{
			name: "peer stops reading: ping timeout",
			cfg:  Config{PingInterval: 100 * time.Millisecond, PingTimeout: 2 * time.Second},
			want: ErrConnClosed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrote := make(chan int64, 1)
			errc := make(chan error, 1)
			started := make(chan struct{})
			h := func(ctx context.Context, req *ServerRequest) {
				if req.Authority != hostileAuthority {
					echoHandler(ctx, req)
					return
				}
				s, err := req.Respond(http.StatusOK, nil)
				if err != nil {
					errc <- err
					return
				}
				defer s.Close()
				close(started)
				// A backend with endless data for the stalled client.
				chunk := make([]byte, 64<<10)
				var n int64
				for {
					if _, err := s.Write(chunk); err != nil {
						wrote <- n
						errc <- err
						return
					}
					n += int64(len(chunk))
				}
			}
			r := startHostile(t, tc.cfg, h)
			p := r.attacker(t, tc.settings...)
			stop := r.sample()
			p.connect(1, hostileAuthority)
			var data atomic.Int64
			readDone := make(chan struct{})
			if tc.readTCP {
				// Read and acknowledge PINGs, never send WINDOW_UPDATE; end
				// the connection once the windows are certainly exhausted.
				go func() {
					defer close(readDone)
					for {
						f, err := p.fr.ReadFrame()
						if err != nil {
							return
						}
						switch f := f.(type) {
						case *http2.DataFrame:
							data.Add(int64(len(f.Data())))
						case *http2.PingFrame:
							if !f.IsAck() {
								_ = p.fr.WritePing(true, f.Data)
							}
						}
					}
				}()
				// Stall for a while: the healthy connection works meanwhile.
				// (Closing before the server read the request would lose it.)
				<-started
				r.checkHealthy(t)
				r.checkHealthy(t)
				_ = p.nc.Close()
			} else {
				close(readDone)
			}
			var err error
			select {
			case err = <-errc:
			case <-testContext(t).Done():
				t.Fatal("the stalled handler was never released")
			}
			<-readDone
			if !errors.Is(err, tc.want) {
				t.Fatalf("stalled handler's Write: %v, want %v", err, tc.want)
			}
			n := <-wrote
			if tc.readTCP {
				// Only the windows' worth of data was taken from the handler;
				// the rest waited in the handler, not in the server.
				limit := int64(initialWindow)
				if got := data.Load(); got > limit {
					t.Errorf("peer received %d bytes with a window of %d", got, limit)
				}
				if n > limit+64<<10 {
					t.Errorf("handler wrote %d bytes into a window of %d", n, limit)
				}
			}
			if peak := stop(); peak > backlogBound(r.cfg) {
				t.Errorf("write backlog peaked at %d bytes, bound %d", peak, backlogBound(r.cfg))
			}
			r.serveErr(t)
			r.checkHealthy(t)
		})
	}
}

// TestHostileFrames: invalid frames and state transitions, each answered as
// RFC 9113 says: a connection error (GOAWAY with the code) or a stream error
// (RST_STREAM with the code, the connection staying up).
func TestHostileFrames(t *testing.T) {
	const rst, goaway = false, true
	for _, tc := range []struct {
		name string
		run  func(p *rawPeer)
		conn bool
		id   uint32 // the reset stream, for stream errors
		code http2.ErrCode
		rfc  string // the RFC 9113 section that decides the answer
	}{
		{"DATA on idle stream", func(p *rawPeer) { _ = p.fr.WriteData(3, false, []byte("x")) }, goaway, 0, http2.ErrCodeProtocol, "5.1 idle"},
		{"HEADERS on closed stream", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			p.expectStatus(1, "200")
			_ = p.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			p.connect(1, hostileAuthority)
		}, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"HEADERS reusing a lower stream ID", func(p *rawPeer) {
			p.connect(5, hostileAuthority)
			p.expectStatus(5, "200")
			p.connect(3, hostileAuthority)
		}, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"HEADERS on half-closed stream", func(p *rawPeer) {
			p.headers(1, true, ":method", "CONNECT", ":authority", hostileAuthority)
			p.expectStatus(1, "200")
			p.headers(1, true, "x-trailer", "1")
		}, rst, 1, http2.ErrCodeStreamClosed, "5.1 half-closed (remote)"},
		{"trailers and DATA after our RST_STREAM ignored", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			p.expectStatus(1, "200")
			_ = p.fr.WriteWindowUpdate(1, maxWindow) // overflows: the server resets the stream
			p.expectRST(1, http2.ErrCodeFlowControl)
			p.headers(1, true, "x-trailer", "1")
			_ = p.fr.WriteData(1, false, []byte("late"))
			p.connect(3, hostileAuthority)
			p.expectStatus(3, "200")
			_ = p.fr.WriteRSTStream(3, http2.ErrCodeCancel)
		}, rst, 0, 0, "5.1 closed: ignore frames after sending RST_STREAM"},
		{"HEADERS on stream 0", func(p *rawPeer) {
			_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 0, BlockFragment: []byte{0x82}, EndHeaders: true})
		}, goaway, 0, http2.ErrCodeProtocol, "6.2"},
		{"PRIORITY on stream 0", func(p *rawPeer) { _ = p.fr.WritePriority(0, http2.PriorityParam{Weight: 1}) }, goaway, 0, http2.ErrCodeProtocol, "6.3"},
		{"RST_STREAM on stream 0", func(p *rawPeer) { _ = p.fr.WriteRSTStream(0, http2.ErrCodeCancel) }, goaway, 0, http2.ErrCodeProtocol, "6.4"},
		{"CONTINUATION on stream 0", func(p *rawPeer) { _ = p.fr.WriteContinuation(0, true, []byte{0x82}) }, goaway, 0, http2.ErrCodeProtocol, "6.10"},
		{"DATA on stream 0", func(p *rawPeer) { _ = p.fr.WriteData(0, false, []byte("x")) }, goaway, 0, http2.ErrCodeProtocol, "6.1"},
		{"SETTINGS on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameSettings, 0, 1, nil) }, goaway, 0, http2.ErrCodeProtocol, "6.5"},
		{"PING on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FramePing, 0, 1, make([]byte, 8)) }, goaway, 0, http2.ErrCodeProtocol, "6.7"},
		{"GOAWAY on a stream", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameGoAway, 0, 1, make([]byte, 8)) }, goaway, 0, http2.ErrCodeProtocol, "6.8"},
		{"PING of 7 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FramePing, 0, 0, make([]byte, 7)) }, goaway, 0, http2.ErrCodeFrameSize, "6.7"},
		{"SETTINGS ACK with payload", func(p *rawPeer) {
			_ = p.fr.WriteRawFrame(http2.FrameSettings, http2.FlagSettingsAck, 0, make([]byte, 6))
		}, goaway, 0, http2.ErrCodeFrameSize, "6.5"},
		{"WINDOW_UPDATE of 3 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 0, make([]byte, 3)) }, goaway, 0, http2.ErrCodeFrameSize, "6.9"},
		{"RST_STREAM of 3 bytes", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			_ = p.fr.WriteRawFrame(http2.FrameRSTStream, 0, 1, make([]byte, 3))
		}, goaway, 0, http2.ErrCodeFrameSize, "6.4"},
		{"GOAWAY of 4 bytes", func(p *rawPeer) { _ = p.fr.WriteRawFrame(http2.FrameGoAway, 0, 0, make([]byte, 4)) }, goaway, 0, http2.ErrCodeFrameSize, "6.8"},
		{"frame above SETTINGS_MAX_FRAME_SIZE", func(p *rawPeer) {
			p.connect(1, hostileAuthority)
			// Only the header: the server must not wait for the payload.
			n := DefaultMaxFrameSize + 1
			_, _ = p.nc.Write([]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(http2.FrameData), 0, 0, 0, 0, 1})
		}, goaway, 0, http2.ErrCodeFrameSize, "4.2"},
		{"PRIORITY of 4 bytes on idle stream", func(p *rawPeer) {
			_ = p.fr.WriteRawFrame(http2.FramePriority, 0, 9, make([]byte, 4))
		}, rst, 9, http2.ErrCodeFrameSize, "6.3"},
		{"client opens even stream", func(p *rawPeer) { p.connect(2, hostileAuthority) }, goaway, 0, http2.ErrCodeProtocol, "5.1.1"},
		{"SETTINGS_ENABLE_PUSH=2", nil, goaway, 0, http2.ErrCodeProtocol, "6.5.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHostile(t, Config{}, holdHandler)
			var settings []http2.Setting
			if tc.run == nil {
				settings = []http2.Setting{{ID: http2.SettingEnablePush, Val: 2}}
			}
			p := r.attacker(t, settings...)
			if tc.run != nil {
				tc.run(p)
			}
			t.Logf("RFC 9113 section %s", tc.rfc)
			switch {
			case tc.conn:
				p.expectGoAway(tc.code)
				if f := p.next(); f != nil {
					t.Fatalf("frame %v after GOAWAY", f.Header())
				}
				expectConnError(t, r.serveErr(t), tc.code)
			case tc.code != 0:
				p.expectRST(tc.id, tc.code)
				pingAlive(t, p)
			default:
				pingAlive(t, p)
			}
			r.checkHealthy(t)
		})
	}
}

// TestHostilePreface: a peer that does not speak HTTP/2 is dropped at once
// (RFC 9113 section 3.4 allows omitting the GOAWAY), without a handler.
func TestHostilePreface(t *testing.T) {
	for _, tc := range []struct {
		name string
		send string
	}{
		{"HTTP/1.1 request", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"truncated preface", http2.ClientPreface[:10]},
		{"preface with a wrong byte", strings.Replace(http2.ClientPreface, "SM", "SN", 1)},
		{"binary junk", string(bytes.Repeat([]byte{0xff}, 64))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHostile(t, Config{}, nil)
			nc, err := r.ts.dial(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_, _ = io.WriteString(nc, tc.send)
			if len(tc.send) < len(http2.ClientPreface) {
				_ = nc.(interface{ CloseWrite() error }).CloseWrite()
			}
			_ = nc.SetReadDeadline(time.Now().Add(testTimeout))
			_, _ = io.Copy(io.Discard, nc)
			err = r.serveErr(t)
			if !errors.Is(err, ErrBadPreface) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("ServeConn: %v, want a bad preface", err)
			}
			if n := r.attacked.Load(); n != 0 {
				t.Errorf("%d handlers ran", n)
			}
			r.checkHealthy(t)
		})
	}
}

// TestResetBudgetRefills: resets within the budget, spread over time, do
// not end a connection; the budget refills at MaxResetStreams per
// ResetWindow.
func TestResetBudgetRefills(t *testing.T) {
	c := newConn(nil, Config{MaxResetStreams: 10, ResetWindow: time.Second}.withDefaults(true), false)
	for i := range 10 {
		if err := c.spendReset(); err != nil {
			t.Fatalf("reset %d within the budget: %v", i, err)
		}
	}
	if err := c.spendReset(); err == nil {
		t.Fatal("the 11th reset within the window was allowed")
	}
	// Half a window later, half the budget is back.
	c.resetStamp = c.resetStamp.Add(-500 * time.Millisecond)
	c.resetTokens = 0
	for i := range 5 {
		if err := c.spendReset(); err != nil {
			t.Fatalf("reset %d after the refill: %v", i, err)
		}
	}
	if err := c.spendReset(); err == nil {
		t.Fatal("more resets allowed than refilled")
	}
	var ce *ConnError
	if err := c.spendReset(); !errors.As(err, &ce) || ce.Code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("spendReset: %v, want ENHANCE_YOUR_CALM", err)
	}
}
