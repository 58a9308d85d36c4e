package hbone

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel/mtls/record"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// TestMain runs the package's tests once per driver (suiteDrivers), then
// checks that no goroutine outlived them.
func TestMain(m *testing.M) {
	flag.Parse()
	code := 0
	for _, d := range suiteDrivers() {
		suiteDriver = d
		if len(suiteDrivers()) > 1 {
			fmt.Fprintf(os.Stderr, "=== hbone tests, %v\n", d)
		}
		if c := m.Run(); c != 0 {
			code = c
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// driverKind is what drives the connections of a suite run.
type driverKind int

const (
	byGoroutines driverKind = iota // reader and writer goroutines
	loopServer                     // the server side loop-driven (testLoop)
	loopClient                     // the client side loop-driven
	loopBoth                       // both sides, on one loop (HBONE_TEST_DRIVERS=both)
)

func (d driverKind) String() string {
	return [...]string{"goroutines", "loop-driven server", "loop-driven client", "loop-driven both sides"}[d]
}

// suiteDriver is the driver of the current suite run.
var suiteDriver driverKind

// nameDriver makes a failure of t name the suite run's driver: the suite
// runs once per driver under the same test names (TestMain), so without it
// a failure would not say which run it is.
func nameDriver(t testing.TB) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("in the suite run with driver: %v", suiteDriver)
		}
	})
}

// suiteDrivers are the runs of the suite: every driver, unless
// HBONE_TEST_DRIVERS names some (goroutines, server, client, both), or the run
// fuzzes or benchmarks (goroutines only: a loop run is about behaviour).
func suiteDrivers() []driverKind {
	if env := os.Getenv("HBONE_TEST_DRIVERS"); env != "" {
		var ds []driverKind
		for _, name := range strings.Split(env, ",") {
			switch strings.TrimSpace(name) {
			case "goroutines":
				ds = append(ds, byGoroutines)
			case "server":
				ds = append(ds, loopServer)
			case "client":
				ds = append(ds, loopClient)
			case "both":
				ds = append(ds, loopBoth)
			}
		}
		return ds
	}
	for _, name := range []string{"test.fuzz", "test.bench"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return []driverKind{byGoroutines}
		}
	}
	return []driverKind{byGoroutines, loopServer, loopClient}
}

// loopDriven reports whether the suite run drives tp's connections on the
// given side by an event loop: plain TCP (loopConn) and mtls/record (fd
// mode) can be.
func loopDriven(tp transport, client bool) bool {
	if tp != overTCP && tp != overRecord {
		return false
	}
	if suiteDriver == loopBoth {
		return true
	}
	if client {
		return suiteDriver == loopClient
	}
	return suiteDriver == loopServer
}

// testTimeout bounds any single wait in a test; it is a hang guard, not a
// timing assertion (longer under the race detector: raceSlowdown).
const testTimeout = raceSlowdown * 20 * time.Second

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testTLS returns a server and a client TLS 1.3 configuration with ALPN h2
// around a fresh self-signed certificate for 127.0.0.1, each side requiring
// the other's (mutual TLS, as HBONE has it). Callers make it once per
// connection set-up, outside any benchmark loop.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	return tlstest.SelfSignedTLS(t)
}

// testServer is an hbone Server on a loopback listener, or on net.Pipes.
type testServer struct {
	*Server
	addr      string
	tlsClient *tls.Config // nil for plain TCP
	record    bool        // TLS through mtls/record
	serveErrs chan error
	pipes     chan net.Conn // overPipe: the server ends of dialed pipes
	tp        transport
	loop      *testLoop // the event loop of a loop-driven suite run
}

// startServer serves h on loopback, over TLS if useTLS. Cleanup closes
// everything and waits for every goroutine.
func startServer(t testing.TB, cfg Config, h Handler, useTLS bool) *testServer {
	t.Helper()
	if useTLS {
		return startServerOver(t, cfg, h, overTLS)
	}
	return startServerOver(t, cfg, h, overTCP)
}

// transport says what carries a test connection.
type transport int

const (
	overTCP    transport = iota // plain TCP
	overTLS                     // crypto/tls
	overRecord                  // mtls/record: the daemon's transport
	// overPipe: net.Pipe, no socket and no TLS, for tests inside a
	// testing/synctest bubble (a socket's I/O does not block durably
	// there, so the bubble's clock could not advance past it).
	overPipe
)

// socketTransports are the transports over real sockets, as subtests name
// them.
var socketTransports = []struct {
	name string
	tp   transport
}{{"tcp", overTCP}, {"tls", overTLS}, {"tls record layer", overRecord}}

// startServerOver is startServer with both sides on transport tp.
func startServerOver(t testing.TB, cfg Config, h Handler, tp transport) *testServer {
	t.Helper()
	return startServerWith(t, cfg, h, tp, nil)
}

// startServerWith is startServerOver calling accepted, if not nil, on each
// accepted connection before its handshake.
func startServerWith(t testing.TB, cfg Config, h Handler, tp transport, accepted func(net.Conn)) *testServer {
	t.Helper()
	nameDriver(t)
	useTLS := tp == overTLS || tp == overRecord
	var loop *testLoop
	if loopDriven(tp, false) || loopDriven(tp, true) {
		// Made first, so stopped last: after the connections ended.
		loop = newTestLoop(t)
	}
	if loopDriven(tp, false) {
		cfg.Drive = loop.drive
	}
	ts := &testServer{Server: NewServer(cfg, h), serveErrs: make(chan error, 100), record: tp == overRecord, tp: tp, loop: loop}
	var ln net.Listener
	if tp == overPipe {
		ts.addr = "pipe"
		ts.pipes = make(chan net.Conn)
		ln = &pipeListener{conns: ts.pipes, done: make(chan struct{})}
	} else {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		ts.addr = ln.Addr().String()
	}
	var serverTLS *tls.Config
	if useTLS {
		serverTLS, ts.tlsClient = testTLS(t)
		// The daemon's servers issue no tickets; mtls/record needs that to
		// keep the records itself.
		serverTLS.SessionTicketsDisabled = true
	}
	wait := serveEach(ln, func(nc net.Conn) {
		if accepted != nil {
			accepted(nc)
		}
		if serverTLS != nil {
			raw := nc
			var tc interface {
				net.Conn
				HandshakeContext(context.Context) error
			} = tls.Server(raw, serverTLS)
			if ts.record {
				tc = record.Server(raw, serverTLS)
			}
			if err := tc.HandshakeContext(context.Background()); err != nil {
				_ = nc.Close()
				return
			}
			nc = tc
		} else if tc, ok := nc.(*net.TCPConn); ok && loopDriven(tp, false) {
			nc = newLoopConn(tc)
		}
		err := ts.ServeConn(context.Background(), nc)
		select {
		case ts.serveErrs <- err:
		default:
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		_ = ts.Close()
		wait()
	})
	return ts
}

// serveEach runs serve on a goroutine of its own for each connection
// accepted on ln, until ln is closed; wait waits for the accept loop and
// every serve to return.
func serveEach(ln net.Listener, serve func(net.Conn)) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { serve(nc) })
		}
	})
	return wg.Wait
}

// pipeListener accepts the server ends of the pipes testServer.dial makes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// dial opens a raw connection to the server (TLS if the server uses it).
func (ts *testServer) dial(ctx context.Context) (net.Conn, error) {
	if ts.pipes != nil {
		c, s := net.Pipe()
		select {
		case ts.pipes <- s:
			return c, nil
		case <-ctx.Done():
			_, _ = c.Close(), s.Close()
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", ts.addr)
	if err != nil || ts.tlsClient == nil {
		return nc, err
	}
	raw := nc
	var tc interface {
		net.Conn
		HandshakeContext(context.Context) error
		ConnectionState() tls.ConnectionState
	} = tls.Client(raw, ts.tlsClient)
	if ts.record {
		tc = record.Client(raw, ts.tlsClient)
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		_ = tc.Close()
		return nil, errors.New("ALPN did not negotiate h2: " + p)
	}
	return tc, nil
}

// client dials the server and starts a ClientConn closed at cleanup.
func (ts *testServer) client(t testing.TB, cfg Config) *ClientConn {
	t.Helper()
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if loopDriven(ts.tp, true) {
		if tc, ok := nc.(*net.TCPConn); ok {
			nc = newLoopConn(tc)
		}
		cfg.Drive = ts.loop.drive
	}
	cc, err := NewClientConn(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// connectStream opens a stream to 10.0.0.1:80 on cc, closed at cleanup.
func connectStream(t testing.TB, cc *ClientConn) *Stream {
	t.Helper()
	s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// sinkHandler answers 200, then reads the stream to its end without writing
// and closes it, returning only then.
func sinkHandler(_ context.Context, req *ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, s)
	s.Close()
}

// echoHandler answers 200 and echoes the stream, propagating half-close.
func echoHandler(_ context.Context, req *ServerRequest) {
	s, err := req.Respond(http.StatusOK, http.Header{"Baggage": {"k8s.cluster.name=test"}})
	if err != nil {
		return
	}
	go echoStream(s, nil)
}

// echoStream is the package's one echo app: it echoes s until the peer's
// END_STREAM, then half-closes and closes s. seen, if not nil, is told how
// many bytes were echoed and their SHA-256 before the half-close, which is
// what lets the peer finish.
func echoStream(s *Stream, seen func(n int64, sum []byte)) {
	defer s.Close()
	var w io.Writer = s
	h := sha256.New()
	if seen != nil {
		w = io.MultiWriter(s, h)
	}
	n, err := io.Copy(w, s)
	if err != nil {
		return
	}
	if seen != nil {
		seen(n, h.Sum(nil))
	}
	_ = s.CloseWrite()
}

// echoOnce checks one round trip of a short message on s, which stays open
// both ways.
func echoOnce(t testing.TB, s *Stream, what string) {
	t.Helper()
	msg := []byte("still here")
	if _, err := s.Write(msg); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("%s: read %q, %v", what, got, err)
	}
}

// rawPeer is a hand-driven HTTP/2 client for protocol-rule tests.
type rawPeer struct {
	t    testing.TB
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

// dialRaw connects to ts as a raw HTTP/2 client and exchanges SETTINGS.
func dialRaw(t testing.TB, ts *testServer, settings ...http2.Setting) *rawPeer {
	t.Helper()
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	return newRawPeer(t, nc, false, settings...)
}

// newRawPeer starts a raw HTTP/2 client on nc (closed at cleanup): the
// preface and SETTINGS. illegal lets it write frames the framer would
// refuse.
func newRawPeer(t testing.TB, nc net.Conn, illegal bool, settings ...http2.Setting) *rawPeer {
	t.Helper()
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(testTimeout))
	p := &rawPeer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	p.enc = hpack.NewEncoder(&p.hbuf)
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.fr.AllowIllegalWrites = illegal
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := p.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return p
}

// headers encodes fields (name, value pairs) as one header block.
func (p *rawPeer) headers(id uint32, end bool, kv ...string) {
	p.t.Helper()
	p.hbuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		_ = p.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: p.hbuf.Bytes(), EndHeaders: true, EndStream: end,
	}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *rawPeer) connect(id uint32, authority string) {
	p.t.Helper()
	p.headers(id, false, ":method", "CONNECT", ":authority", authority)
}

// next returns the next frame that is not SETTINGS, WINDOW_UPDATE or a PING
// request, acknowledging SETTINGS and PINGs along the way. At EOF it returns
// nil.
func (p *rawPeer) next() http2.Frame {
	p.t.Helper()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isConnReset(err) {
				return nil
			}
			p.t.Fatalf("read frame: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = p.fr.WriteSettingsAck()
			}
			continue
		case *http2.WindowUpdateFrame:
			continue
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = p.fr.WritePing(true, f.Data)
				continue
			}
		}
		return f
	}
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// expectGoAway reads until a GOAWAY and checks its code.
func (p *rawPeer) expectGoAway(code http2.ErrCode) {
	p.t.Helper()
	for {
		f := p.next()
		if f == nil {
			p.t.Fatalf("connection closed without GOAWAY %v", code)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != code {
				p.t.Fatalf("GOAWAY %v, want %v", ga.ErrCode, code)
			}
			return
		}
	}
}

// expectRST reads until RST_STREAM on id and checks its code.
func (p *rawPeer) expectRST(id uint32, code http2.ErrCode) {
	p.t.Helper()
	for {
		f := p.next()
		if f == nil {
			p.t.Fatalf("connection closed without RST_STREAM %v", code)
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				if f.ErrCode != code {
					p.t.Fatalf("RST_STREAM %v on stream %d, want %v", f.ErrCode, id, code)
				}
				return
			}
		case *http2.GoAwayFrame:
			p.t.Fatalf("GOAWAY %v, want RST_STREAM %v on stream %d", f.ErrCode, code, id)
		}
	}
}

// expectStatus reads until the response HEADERS on id and returns them.
func (p *rawPeer) expectStatus(id uint32, status string) *http2.MetaHeadersFrame {
	p.t.Helper()
	for {
		f := p.next()
		if f == nil {
			p.t.Fatalf("connection closed before the response on stream %d", id)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				if got := f.PseudoValue("status"); got != status {
					p.t.Fatalf("status %s, want %s", got, status)
				}
				return f
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				p.t.Fatalf("RST_STREAM %v, want status %s", f.ErrCode, status)
			}
		case *http2.GoAwayFrame:
			p.t.Fatalf("GOAWAY %v, want status %s", f.ErrCode, status)
		}
	}
}
