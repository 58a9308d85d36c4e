package record

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// interopCases are the end pairings every data test runs over.
var interopCases = []struct{ cli, srv kind }{
	{kindOurs, kindTLS},
	{kindTLS, kindOurs},
	{kindOurs, kindOurs},
	{kindFallback, kindTLS},
	{kindTLS, kindFallback},
	{kindFallback, kindOurs},
	{kindOurs, kindFallback},
}

var interopSizes = []int{0, 1, 16383, 16384, 16385, 1 << 20}

// exchange sends n random bytes each way at once and checks what arrives.
func exchange(t *testing.T, a, b net.Conn, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	send := func(c net.Conn) [32]byte {
		buf := make([]byte, n)
		rand.Read(buf)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k, err := c.Write(buf); err != nil || k != n {
				errs <- fmt.Errorf("write %d bytes: wrote %d, %v", n, k, err)
			}
		}()
		return sha256.Sum256(buf)
	}
	recv := func(c net.Conn, want [32]byte) {
		defer wg.Done()
		h := sha256.New()
		if k, err := io.CopyN(h, c, int64(n)); err != nil {
			errs <- fmt.Errorf("read %d bytes: got %d, %v", n, k, err)
			return
		}
		if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
			errs <- fmt.Errorf("%d bytes arrived with the wrong checksum", n)
		}
	}
	ha, hb := send(a), send(b)
	wg.Add(2)
	go recv(b, ha)
	go recv(a, hb)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInterop(t *testing.T) {
	for _, ic := range interopCases {
		t.Run(fmt.Sprintf("%s-client/%s-server", ic.cli, ic.srv), func(t *testing.T) {
			cli, srv := pair(t, ic.cli, ic.srv, nil)
			for _, n := range interopSizes {
				t.Run(fmt.Sprint(n), func(t *testing.T) { exchange(t, cli, srv, n) })
			}
			if st := cli.(interface{ ConnectionState() tls.ConnectionState }).ConnectionState(); st.NegotiatedProtocol != "h2" {
				t.Errorf("ALPN %q, want h2", st.NegotiatedProtocol)
			}
		})
	}
}

// TestHalfClose: after CloseWrite the peer reads everything then io.EOF,
// and can still send back.
func TestHalfClose(t *testing.T) {
	for _, ic := range interopCases {
		for _, closer := range []string{"client", "server"} {
			t.Run(fmt.Sprintf("%s-client/%s-server/%s-closes", ic.cli, ic.srv, closer), func(t *testing.T) {
				cli, srv := pair(t, ic.cli, ic.srv, nil)
				a, b := cli, srv
				if closer == "server" {
					a, b = srv, cli
				}
				msg := bytes.Repeat([]byte("x"), 40000)
				errc := make(chan error, 1)
				go func() {
					if _, err := a.Write(msg); err != nil {
						errc <- err
						return
					}
					errc <- a.CloseWrite()
				}()
				got, err := io.ReadAll(b)
				if err != nil {
					t.Fatalf("peer read: %v", err)
				}
				if err := <-errc; err != nil {
					t.Fatalf("write, CloseWrite: %v", err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("peer read %d bytes, want %d", len(got), len(msg))
				}
				if _, err := b.Write([]byte("reply")); err != nil {
					t.Fatalf("peer write after half-close: %v", err)
				}
				reply := make([]byte, 5)
				if _, err := io.ReadFull(a, reply); err != nil || string(reply) != "reply" {
					t.Fatalf("reply %q, %v", reply, err)
				}
				if _, err := a.Write([]byte("more")); err == nil {
					t.Fatal("write after CloseWrite succeeded")
				}
			})
		}
	}
}

// TestCloseSendsCloseNotify: the peer of a closed connection reads io.EOF,
// not a truncation error.
func TestCloseSendsCloseNotify(t *testing.T) {
	for _, ic := range interopCases {
		t.Run(fmt.Sprintf("%s-client/%s-server", ic.cli, ic.srv), func(t *testing.T) {
			cli, srv := pair(t, ic.cli, ic.srv, nil)
			if _, err := cli.Write([]byte("last")); err != nil {
				t.Fatal(err)
			}
			if err := cli.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			got, err := io.ReadAll(srv)
			if err != nil || string(got) != "last" {
				t.Fatalf("server read %q, %v; want \"last\", EOF", got, err)
			}
		})
	}
}

// TestSessionTickets: a crypto/tls server that issues tickets sends them
// with the application keys; our client skips them. Our server with
// tickets on falls back to crypto/tls's records (its tickets would shift
// the sequence numbers).
func TestSessionTickets(t *testing.T) {
	tickets := func(cli, srv *tls.Config) {
		srv.SessionTicketsDisabled = false
		cli.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	}
	for _, tc := range []struct {
		name     string
		cli, srv kind
		fallback bool // the server end falls back
	}{
		{"ours client skips tickets", kindOurs, kindTLS, false},
		{"ours server falls back", kindTLS, kindOurs, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, scfg := testConfigs(t)
			tickets(ccfg, scfg)
			cr, sr := nettest.TCPPair(t)
			cli, srv := wrap(tc.cli, cr, ccfg, true), wrap(tc.srv, sr, scfg, false)
			handshakePair(t, cli, srv)
			defer cli.Close()
			defer srv.Close()
			if c, ok := srv.(*Conn); ok && c.fallback != tc.fallback {
				t.Fatalf("server fallback = %v, want %v", c.fallback, tc.fallback)
			}
			if c, ok := cli.(*Conn); ok && c.fallback {
				t.Fatal("client fell back")
			}
			exchange(t, cli, srv, 100000)
		})
	}
}

// TestNotTLS13: a TLS 1.2 connection keeps crypto/tls's records.
func TestNotTLS13(t *testing.T) {
	ccfg, scfg := testConfigs(t)
	scfg.MinVersion, scfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	ccfg.MinVersion = tls.VersionTLS12
	cr, sr := nettest.TCPPair(t)
	cli, srv := Client(cr, ccfg), wrap(kindTLS, sr, scfg, false)
	handshakePair(t, cli, srv)
	defer cli.Close()
	defer srv.Close()
	if !cli.fallback {
		t.Fatal("TLS 1.2 connection uses our record layer")
	}
	exchange(t, cli, srv, 50000)
	if err := cli.KeyUpdate(false); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("KeyUpdate on fallback: %v, want ErrUnsupported", err)
	}
}

// TestKeyLogWriterKept: a KeyLogWriter in the caller's config still gets
// crypto/tls's lines.
func TestKeyLogWriterKept(t *testing.T) {
	var logged bytes.Buffer
	ccfg, scfg := testConfigs(t)
	ccfg.KeyLogWriter = &logged
	cr, sr := nettest.TCPPair(t)
	cli, srv := Client(cr, ccfg), Server(sr, scfg)
	handshakePair(t, cli, srv)
	defer cli.Close()
	defer srv.Close()
	if !bytes.Contains(logged.Bytes(), []byte(labelClientTraffic)) {
		t.Fatalf("caller's KeyLogWriter got no %s line", labelClientTraffic)
	}
	if cli.fallback || srv.fallback {
		t.Fatal("fell back")
	}
	if cli.keys.client != nil || srv.keys.server != nil {
		t.Fatal("captured secrets kept after the handshake")
	}
	exchange(t, cli, srv, 1000)
}

// TestGetConfigForClient: a server config that picks its config per hello
// (as mtls.ServerConfig does) still hands the secrets to the connection.
func TestGetConfigForClient(t *testing.T) {
	ccfg, scfg := testConfigs(t)
	inner := scfg.Clone()
	outer := &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return inner, nil }}
	for _, tc := range []struct {
		name     string
		tickets  bool
		fallback bool
	}{
		{"tickets disabled", false, false},
		{"tickets enabled", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner.SessionTicketsDisabled = !tc.tickets
			cr, sr := nettest.TCPPair(t)
			cli, srv := Client(cr, ccfg), Server(sr, outer)
			handshakePair(t, cli, srv)
			defer cli.Close()
			defer srv.Close()
			if srv.fallback != tc.fallback {
				t.Fatalf("server fallback = %v, want %v", srv.fallback, tc.fallback)
			}
			if inner.KeyLogWriter != nil {
				t.Fatal("the config GetConfigForClient returned was changed")
			}
			exchange(t, cli, srv, 70000)
		})
	}
}

// TestLeftoverAfterFinished: the client's Finished and its first data
// arrive in one TCP segment; the server's handshake must leave the data
// for the record layer.
func TestLeftoverAfterFinished(t *testing.T) {
	for _, ck := range []kind{kindTLS, kindOurs} {
		t.Run(string(ck)+"-client", func(t *testing.T) {
			for i := range 30 {
				ccfg, scfg := testConfigs(t)
				cr, sr := nettest.TCPPair(t)
				hc := &holdConn{Conn: cr}
				cli, srv := wrap(ck, hc, ccfg, true), Server(sr, scfg)
				msg := fmt.Appendf(nil, "first data %d", i)
				handshakeWithHeldData(t, cli, srv, hc, msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(srv, got); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("round %d: read %q, %v", i, got, err)
				}
				cli.Close()
				srv.Close()
			}
		})
	}
}

// handshakeWithHeldData completes the handshake of cli (over hc) and srv
// while cli writes msg: hc holds msg and what follows the client's
// Finished until flushed, so the server's handshake ends before that data
// arrives and its first read finds it behind the handshake records.
func handshakeWithHeldData(t *testing.T, cli interface {
	HandshakeContext(context.Context) error
	Write([]byte) (int, error)
}, srv *Conn, hc *holdConn, msg []byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		if err := cli.HandshakeContext(t.Context()); err != nil {
			errc <- err
			return
		}
		if _, err := cli.Write(msg); err != nil {
			errc <- err
			return
		}
		errc <- hc.flush()
	}()
	if err := srv.HandshakeContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// holdConn passes writes through until its first read returns, then holds
// them until flush writes them all at once.
type holdConn struct {
	net.Conn
	mu      sync.Mutex
	holding bool
	held    []byte
}

func (h *holdConn) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	h.mu.Lock()
	h.holding = h.holding || n > 0
	h.mu.Unlock()
	return n, err
}

func (h *holdConn) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.holding {
		return h.Conn.Write(p)
	}
	h.held = append(h.held, p...)
	return len(p), nil
}

func (h *holdConn) flush() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding = false
	_, err := h.Conn.Write(h.held)
	h.held = nil
	return err
}

// countConn counts the writes on a connection.
type countConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
}

func (c *countConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// TestOneWritePerBatch: a Write of up to 256 KiB is one write on the
// socket, whatever KeyUpdate it carries.
func TestOneWritePerBatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size      int
		keyUpdate bool // a KeyUpdate the peer requested rides along
		want      int
	}{
		{"1 byte", 1, false, 1},
		{"256 KiB", 256 << 10, false, 1},
		{"256 KiB with KeyUpdate", 256 << 10, true, 1},
		{"256 KiB + 1", 256<<10 + 1, false, 2},
		{"1 MiB", 1 << 20, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, scfg := testConfigs(t)
			cr, sr := nettest.TCPPair(t)
			cc := &countConn{Conn: cr}
			cli, srv := Client(cc, ccfg), tls.Server(sr, scfg)
			handshakePair(t, cli, srv)
			defer cli.Close()
			defer srv.Close()
			done := make(chan error, 1)
			go func() {
				_, err := io.CopyN(io.Discard, srv, int64(tc.size))
				done <- err
			}()
			cli.pendingKeyUpdate.Store(tc.keyUpdate)
			before := cc.count()
			if _, err := cli.Write(make([]byte, tc.size)); err != nil {
				t.Fatal(err)
			}
			if got := cc.count() - before; got != tc.want {
				t.Errorf("%d writes on the socket, want %d", got, tc.want)
			}
			if err := <-done; err != nil {
				t.Fatalf("peer read: %v", err)
			}
		})
	}
}

// TestIdleHoldsNoBuffer: once everything sent has been read, neither end
// holds a read buffer (write buffers are never held between Writes).
func TestIdleHoldsNoBuffer(t *testing.T) {
	cli, srv := pair(t, kindOurs, kindOurs, nil)
	for _, n := range []int{1, 16385, 1 << 20} {
		exchange(t, cli, srv, n)
		for _, c := range []*Conn{cli.(*Conn), srv.(*Conn)} {
			c.rmu.Lock()
			held := c.rb != nil
			c.rmu.Unlock()
			if held {
				t.Errorf("after %d bytes: an idle connection holds its read buffer", n)
			}
		}
	}
}

// TestBlockedReaderHoldsNoBuffer: a Read that waits on an idle connection
// (an HBONE connection's reader goroutine always does) holds no read
// buffer. With the 128 KiB buffer held, the heap would grow by twice that
// per pair; the bound is a quarter of one buffer.
func TestBlockedReaderHoldsNoBuffer(t *testing.T) {
	const pairs = 50
	conns := make([]endpoint, 0, 2*pairs)
	for range pairs {
		cli, srv := pair(t, kindOurs, kindOurs, nil)
		exchange(t, cli, srv, 1)
		conns = append(conns, cli, srv)
	}
	heap := func() uint64 {
		// Two collections: the first moves free pooled buffers to the
		// pool's victim cache, the second frees them, so that only buffers
		// something holds are counted.
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	var readers sync.WaitGroup
	started := make(chan struct{}, len(conns))
	for _, c := range conns {
		readers.Go(func() {
			started <- struct{}{}
			var b [1]byte
			_, _ = c.Read(b[:]) // returns when the test closes the pair
		})
	}
	for range conns {
		<-started
	}
	// Let every reader reach its wait in the poller. On a loaded machine
	// some may still be on their way (holding a buffer for the read they
	// are about to find empty) when the heap is measured, so it is measured
	// again until the bound holds or a second has passed: a buffer that a
	// waiting reader really held would never let it.
	var per int64
	for deadline := time.Now().Add(time.Second); ; {
		for range 100 {
			runtime.Gosched()
		}
		per = (int64(heap()) - int64(before)) / int64(len(conns))
		if per <= rawBufSize/4 || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range conns {
		c.Close()
	}
	readers.Wait()
	if per > rawBufSize/4 {
		t.Fatalf("heap grew %d B per connection with a reader waiting on it, want well under the %d B read buffer", per, rawBufSize)
	}
}
