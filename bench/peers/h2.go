package peers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// H2Server is the server half of the naive HBONE: mutual TLS 1.3, then
// x/net/http2's Server; each CONNECT request dials its authority and copies
// both ways with io.Copy, flushing every write.
func H2Server(ctx context.Context, ln net.Listener, cert *mtls.WorkloadCert, cfg Config) error {
	cfg = cfg.withDefaults()
	tlsCfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil })
	d := cfg.dialer()
	srv := &http2.Server{}
	var a load.Acceptor
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		up, err := d.DialContext(r.Context(), "tcp", r.Host)
		if err != nil {
			cfg.Logf("peers: h2 server: dial %s: %v", r.Host, err)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		fl.Flush()
		// Upload: ends when the client half-closes (END_STREAM) or, after
		// this handler returns, when the server closes the request body.
		a.Go(func() {
			if _, err := io.Copy(up, r.Body); err == nil {
				closeWrite(up)
				return
			}
			up.Close()
		})
		// Download: returning sends END_STREAM.
		_, _ = io.Copy(flushWriter{w, fl}, up)
	})
	return serve(ctx, &a, ln, func(ctx context.Context, c net.Conn) {
		tc := serverHandshake(ctx, c, tlsCfg, cfg, "h2 server")
		if tc == nil {
			return
		}
		srv.ServeConn(tc, &http2.ServeConnOpts{Context: ctx, Handler: handler})
		tc.Close()
	})
}

type flushWriter struct {
	w  io.Writer
	fl http.Flusher
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.fl.Flush()
	return n, err
}

// H2Client is the client half of the naive HBONE: every TCP connection
// accepted on ln becomes a CONNECT stream for authority, sent through
// x/net/http2's Transport over mutual TLS to server (the peer's H2Server),
// which must present one of sans. The Transport pools the connections.
func H2Client(ctx context.Context, ln net.Listener, server, authority string, cert *mtls.WorkloadCert, sans []string, cfg Config) error {
	cfg = cfg.withDefaults()
	if len(sans) == 0 {
		return errors.New("peers: h2 client needs the server's identity")
	}
	tlsCfg := mtls.ClientConfig(cert, sans)
	d := cfg.dialer()
	tr := &http2.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			raw, err := d.DialContext(ctx, "tcp", server)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return tc, nil
		},
	}
	defer tr.CloseIdleConnections()
	target := &url.URL{Scheme: "https", Host: server}
	var a load.Acceptor
	return serve(ctx, &a, ln, func(ctx context.Context, c net.Conn) {
		defer c.Close()
		pr, pw := io.Pipe()
		req := (&http.Request{
			Method: http.MethodConnect, URL: target, Host: authority,
			Header: http.Header{}, Body: pr, ContentLength: -1,
			Proto: "HTTP/2.0", ProtoMajor: 2,
		}).WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			cfg.Logf("peers: h2 client: CONNECT %s via %s: %v", authority, server, err)
			pw.Close()
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			cfg.Logf("peers: h2 client: CONNECT %s: %s", authority, resp.Status)
			pw.Close()
			return
		}
		up := make(chan struct{})
		go func() {
			defer close(up)
			_, err := io.Copy(pw, c)
			pw.CloseWithError(err) // nil: END_STREAM
		}()
		if _, err := io.Copy(c, resp.Body); err != nil {
			c.Close() // unblocks the upload
			pw.CloseWithError(fmt.Errorf("download: %w", err))
		} else {
			closeWrite(c)
		}
		<-up
	})
}
