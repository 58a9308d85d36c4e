// Package hbonetest runs HBONE servers on loopback for tests of code that
// speaks HBONE (the proxy, the load generator). Imports (of ours): hbone and
// mtls/tlstest.
// Imported by: tests.
package hbonetest

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// Server is an hbone.Server on a loopback listener.
type Server struct {
	*hbone.Server
	// Addr is the listener's "ip:port".
	Addr string

	tlsConfig *tls.Config
	mu        sync.Mutex // guards errs
	errs      []error
}

// Start serves h on 127.0.0.1. With tlsConfig nil it speaks HTTP/2 with
// prior knowledge over plain TCP; otherwise TLS with that configuration
// (which should offer ALPN "h2"). Cleanup closes the listener and the
// server and waits for every goroutine it started.
func Start(t testing.TB, cfg hbone.Config, h hbone.Handler, tlsConfig *tls.Config) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Server: hbone.NewServer(cfg, h), Addr: ln.Addr().String(), tlsConfig: tlsConfig}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { s.serve(nc) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		_ = s.Close()
		wg.Wait()
	})
	return s
}

func (s *Server) serve(nc net.Conn) {
	if s.tlsConfig != nil {
		tc := tls.Server(nc, s.tlsConfig)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			_ = nc.Close()
			s.record(err)
			return
		}
		nc = tc
	}
	if err := s.ServeConn(context.Background(), nc); err != nil {
		s.record(err)
	}
}

func (s *Server) record(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// Errors returns the errors of connections that ended badly so far (TLS
// handshakes, protocol errors).
func (s *Server) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// Dial connects to the server over TCP and, if clientConfig is not nil, TLS,
// requiring ALPN "h2".
func (s *Server) Dial(ctx context.Context, clientConfig *tls.Config) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil || clientConfig == nil {
		return nc, err
	}
	tc := tls.Client(nc, clientConfig)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		_ = tc.Close()
		return nil, errors.New("hbonetest: ALPN negotiated " + p + ", not h2")
	}
	return tc, nil
}

// Echo is a Handler that answers 200 and echoes the stream back, ending its
// direction when the client ends its own.
func Echo(_ context.Context, req *hbone.ServerRequest) {
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	go func() {
		defer s.Close()
		if _, err := io.Copy(s, s); err == nil {
			_ = s.CloseWrite()
		}
	}()
}

// Status returns a Handler that answers every request with code.
func Status(code int) hbone.Handler {
	return func(_ context.Context, req *hbone.ServerRequest) {
		_, _ = req.Respond(code, nil)
	}
}

// SelfSignedTLS returns TLS 1.3 configurations with ALPN "h2" for a server
// and a client sharing one fresh self-signed certificate for 127.0.0.1,
// each requiring the other's certificate (mutual TLS, as HBONE does). It is
// tlstest.SelfSignedTLS, kept here for the tests that only know this kit.
func SelfSignedTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	return tlstest.SelfSignedTLS(t)
}
