package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"sync"
	"testing"
)

// nestedServer is double HBONE in miniature: an outer server whose every
// CONNECT stream carries a TLS session with an inner HBONE server on it.
type nestedServer struct {
	outer     *testServer
	clientTLS *tls.Config
}

func startNested(t *testing.T) *nestedServer {
	t.Helper()
	serverTLS, clientTLS := testTLS(t)
	inner := NewServer(Config{}, func(ctx context.Context, req *ServerRequest) {
		if req.Authority == "deny.example:80" {
			_, _ = req.Respond(http.StatusUnauthorized, nil)
			return
		}
		// Echo, telling the client which network header arrived.
		s, err := req.Respond(http.StatusOK, http.Header{"X-Seen-Network": {req.Header.Get("X-Forwarded-Network")}})
		if err != nil {
			return
		}
		go func() {
			defer s.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = s.CloseWrite()
					return
				}
			}
		}()
	})
	var wg sync.WaitGroup
	outer := startServer(t, Config{}, func(ctx context.Context, req *ServerRequest) {
		s, err := req.Respond(http.StatusOK, nil)
		if err != nil {
			return
		}
		wg.Go(func() {
			tc := tls.Server(s, serverTLS)
			if err := tc.HandshakeContext(context.Background()); err != nil {
				_ = s.Close()
				return
			}
			_ = inner.ServeConn(context.Background(), tc)
			_ = tc.Close()
		})
	}, false)
	t.Cleanup(func() {
		_ = inner.Close()
		_ = outer.Close()
		wg.Wait()
	})
	return &nestedServer{outer: outer, clientTLS: clientTLS}
}

// TestConnectOnceNested runs TLS and HTTP/2 over a Stream and checks that
// the single-use inner connection hands its outer stream back when done.
func TestConnectOnceNested(t *testing.T) {
	ns := startNested(t)
	cc := ns.outer.client(t, Config{})
	tests := []struct {
		name      string
		authority string
		wantCode  int // 0 = 200 and echo
		bytes     int64
	}{
		{"echo small", "svc.example:80", 0, 1 << 10},
		{"echo beyond the windows", "svc.example:80", 0, 9 << 20},
		{"inner refusal", "deny.example:80", http.StatusUnauthorized, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			outerStream, err := cc.Connect(ctx, &Request{Authority: tc.authority})
			if err != nil {
				t.Fatal(err)
			}
			conn := tls.Client(outerStream, ns.clientTLS)
			if err := conn.HandshakeContext(ctx); err != nil {
				t.Fatal(err)
			}
			s, err := ConnectOnce(ctx, conn, Config{}, &Request{
				Authority: tc.authority, Header: http.Header{"X-Forwarded-Network": {"net-a"}},
			})
			if tc.wantCode != 0 {
				var se *StatusError
				if !errors.As(err, &se) || se.Code != tc.wantCode {
					t.Fatalf("ConnectOnce: %v, want status %d", err, tc.wantCode)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if got := s.ResponseHeader().Get("X-Seen-Network"); got != "net-a" {
					t.Errorf("inner server saw x-forwarded-network %q", got)
				}
				echoRoundTrip(t, s, 7, tc.bytes, 16<<10)
				_ = s.Close()
			}
			// The inner connection closed itself, which closed the outer stream.
			waitFor(t, "the outer stream to be released", func() bool { return cc.NumActiveStreams() == 0 })
		})
	}
	if !cc.CanTakeNewStream() {
		t.Fatal("outer connection unusable after the inner ones ended")
	}
}

func TestConnectOnceNilConn(t *testing.T) {
	if _, err := ConnectOnce(testContext(t), nil, Config{}, &Request{Authority: "a:1"}); err == nil {
		t.Fatal("ConnectOnce(nil) succeeded")
	}
}
