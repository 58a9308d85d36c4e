package hbone

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Hostile peers that flood the server (rapid reset, streams, control
// frames) and the reset budget that cuts them off; the rig is in
// hostile_test.go.

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
			stop := r.sample(t)
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
			// 13-byte RST_STREAMs; the server cuts the peer off after
			// ~40,000 (its control backlog bound), so n is only a ceiling.
			// Runs where the connection "never ended" were a TCP stall of
			// the rig, not buffering: the attacker's receive buffer was
			// shrunk after the handshake (see attacker).
			n: 1_500_000,
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
			name:  "empty CONTINUATION flood",
			n:     1_000_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) { return continuations(p, nil) },
			code:  http2.ErrCodeEnhanceYourCalm,
		},
		{
			name:  "endless CONTINUATION of header fields",
			n:     100_000,
			frame: func(p *rawPeer) func(*http2.Framer, int) { return continuations(p, junkField()) },
			// The framer stops decoding once the list limit is exceeded.
			code: http2.ErrCodeProtocol,
		},
		{
			name:  "header block larger than the wire budget",
			cfg:   Config{MaxHeaderListSize: 1 << 20, MaxHeaderBlockSize: 32 << 10},
			n:     100,
			frame: func(p *rawPeer) func(*http2.Framer, int) { return continuations(p, junkField()) },
			code:  http2.ErrCodeEnhanceYourCalm,
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
			cfg := tc.cfg
			if tc.code != 0 && cfg.PingInterval == 0 {
				// The attacker does not read, so a keepalive PING would go
				// unanswered and end the connection on its own clock
				// (DefaultPingTimeout): on a slow -race run of a big flood,
				// before the bound under test is reached.
				cfg.PingInterval = -1
			}
			r := startHostile(t, cfg, holdHandler)
			p := r.attacker(t, tc.settings...)
			stop := r.sample(t)
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

// TestFloodWriterBlocked: a peer that floods frames demanding answers and
// never reads ends its connection with ENHANCE_YOUR_CALM even when the
// server's writer is blocked on it from the first byte (net.Pipe buffers
// nothing), and within the bounded final flush: the reader never waits on
// the writer, and the control backlog bound, not the peer's patience, ends
// the connection. Over sockets under CPU load these floods can take long
// (the reader must process ~25k requests or ~58k SETTINGS before the
// backlog passes its bound); this pins that nothing but CPU time is needed.
func TestFloodWriterBlocked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		frame func(p *rawPeer) func(fr *http2.Framer, i int)
	}{
		{
			name: "SETTINGS",
			frame: func(*rawPeer) func(*http2.Framer, int) {
				return func(fr *http2.Framer, _ int) {
					_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
				}
			},
		},
		{
			name: "malformed requests",
			cfg:  Config{MaxResetStreams: 1 << 30},
			frame: func(p *rawPeer) func(*http2.Framer, int) {
				block := p.headerBlock(":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1")
				return func(fr *http2.Framer, i int) {
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true})
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := startServerOver(t, tc.cfg, holdHandler, overPipe)
				nc, err := ts.dial(testContext(t))
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				p := newRawPeer(t, nc, true)
				const n = 2_000_000 // far more than the bound lets through
				sent := flood(p, n, tc.frame(p))
				err = <-ts.serveErrs
				elapsed := time.Since(start)
				_ = nc.Close()
				expectConnError(t, err, http2.ErrCodeEnhanceYourCalm)
				if got := sent(); got == n {
					t.Errorf("the server read all %d frames of a peer that never read", n)
				}
				// The reader ends at once; only the writer's final flush,
				// bounded by closeFlushTimeout, waits (fake time).
				if limit := closeFlushTimeout + abruptCloseTimeout; elapsed > limit {
					t.Errorf("the connection took %v to end, want at most %v", elapsed, limit)
				}
			})
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

// continuations opens stream 1 with a CONNECT header block it never ends,
// continuing it with frag in every frame after the first.
func continuations(p *rawPeer, frag []byte) func(*http2.Framer, int) {
	start := p.headerBlock(":method", "CONNECT", ":authority", hostileAuthority)
	return func(fr *http2.Framer, i int) {
		if i == 0 {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: start})
			return
		}
		_ = fr.WriteContinuation(1, false, frag)
	}
}

// junkField is one HPACK-encoded header field of 1000 bytes, never indexed.
func junkField() []byte {
	var b bytes.Buffer
	_ = hpack.NewEncoder(&b).WriteField(hpack.HeaderField{Name: "x-junk", Value: strings.Repeat("j", 1000), Sensitive: true})
	return b.Bytes()
}
