package hbone

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"golang.org/x/net/http2"
)

// TestInteropXNetClient: x/net/http2's Transport sends CONNECT with a
// full-duplex body over TLS (ALPN h2) to our Server.
func TestInteropXNetClient(t *testing.T) {
	ts := startServerOver(t, Config{}, func(ctx context.Context, req *ServerRequest) {
		if req.Authority == "deny.example:80" {
			_, _ = req.Respond(http.StatusUnauthorized, nil)
			return
		}
		echoHandler(ctx, req)
	}, suiteServerTransport())
	tr := &http2.Transport{TLSClientConfig: ts.tlsClient}
	defer tr.CloseIdleConnections()

	connect := func(authority string, body io.Reader) (*http.Response, error) {
		req := &http.Request{
			Method: http.MethodConnect,
			URL:    &url.URL{Scheme: "https", Host: ts.addr},
			Host:   authority,
			Header: http.Header{"Baggage": {"k8s.namespace.name=default"}},
			Body:   io.NopCloser(body),
		}
		return tr.RoundTrip(req.WithContext(testContext(t)))
	}

	t.Run("echo", func(t *testing.T) {
		pr, pw := io.Pipe()
		resp, err := connect("10.0.0.1:80", pr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Baggage") != "k8s.cluster.name=test" {
			t.Fatalf("response %d %v", resp.StatusCode, resp.Header)
		}
		const n = 16 << 20
		want := sha256.New()
		errc := make(chan error, 1)
		go func() {
			_, err := io.Copy(pw, io.TeeReader(randomReader(3, n), want))
			_ = pw.CloseWithError(err)
			errc <- err
		}()
		got := sha256.New()
		m, err := io.Copy(got, resp.Body)
		if err != nil {
			t.Fatalf("reading echo after %d bytes: %v", m, err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if m != n || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
			t.Fatalf("echo: %d bytes, checksum match %v", m, bytes.Equal(got.Sum(nil), want.Sum(nil)))
		}
	})
	t.Run("refused", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		resp, err := connect("deny.example:80", pr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	})
}

// TestInteropXNetServer: our ClientConn against x/net/http2's Server over
// TLS, with a handler that answers CONNECT 200 and echoes, flushing.
func TestInteropXNetServer(t *testing.T) {
	serverTLS, clientTLS := testTLS(t)
	addr, stop := startXNetServer(t, serverTLS, http.HandlerFunc(xnetEcho))
	defer stop()

	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc := suiteTLS(raw, clientTLS, true)
	if err := nc.HandshakeContext(testContext(t)); err != nil {
		_ = raw.Close()
		t.Fatal(err)
	}
	if p := nc.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN %q", p)
	}
	cc, err := NewClientConn(nc, suiteConfig(t, Config{}, true))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	var swg sync.WaitGroup
	for i := range 4 {
		swg.Go(func() {
			s, err := cc.Connect(testContext(t), &Request{Authority: "10.0.0.1:80", Header: http.Header{"Forwarded": {`for="1.2.3.4:5"`}}})
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			if s.ResponseHeader().Get("X-Authority") != "10.0.0.1:80" || s.ResponseHeader().Get("X-Forwarded") != `for="1.2.3.4:5"` {
				t.Errorf("x/net server saw %v", s.ResponseHeader())
			}
			echoRoundTrip(t, s, uint64(10+i), 4<<20, 48<<10)
		})
	}
	swg.Wait()

	_, err = cc.Connect(testContext(t), &Request{Authority: "deny.example:80"})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("Connect: %v, want StatusError 403", err)
	}
}

func xnetEcho(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if r.Host == "deny.example:80" {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	w.Header().Set("X-Authority", r.Host)
	w.Header().Set("X-Forwarded", r.Header.Get("Forwarded"))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// startXNetServer serves h with x/net/http2's Server over TLS on loopback;
// stop closes the listener and the connections and waits for their
// goroutines.
func startXNetServer(t testing.TB, cfg *tls.Config, h http.Handler) (addr string, stop func()) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	h2 := &http2.Server{}
	var mu sync.Mutex
	var conns []net.Conn
	stopped := false
	wait := serveEach(ln, func(nc net.Conn) {
		mu.Lock()
		if stopped {
			mu.Unlock()
			_ = nc.Close()
			return
		}
		conns = append(conns, nc)
		mu.Unlock()
		// x/net's server wants the handshake done (it checks the
		// negotiated version).
		if err := nc.(*tls.Conn).HandshakeContext(context.Background()); err != nil {
			_ = nc.Close()
			return
		}
		h2.ServeConn(nc, &http2.ServeConnOpts{Handler: h})
	})
	return ln.Addr().String(), func() {
		_ = ln.Close()
		mu.Lock()
		stopped = true
		for _, nc := range conns {
			_ = nc.Close()
		}
		mu.Unlock()
		wait()
	}
}

// xnetDiscard answers 200 and reads the request body to its end.
func xnetDiscard(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	_, _ = io.CopyBuffer(io.Discard, r.Body, make([]byte, 64<<10))
}
