package peers

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// TLS terminates mutual TLS 1.3 (the HBONE server config: client
// certificate required, same trust domain) on every connection accepted on
// ln and forwards the plaintext to the address to.
func TLS(ctx context.Context, ln net.Listener, to string, cert *mtls.WorkloadCert, cfg Config) error {
	cfg = cfg.withDefaults()
	tlsCfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil })
	d := cfg.dialer()
	var a load.Acceptor
	return serve(ctx, &a, ln, func(ctx context.Context, c net.Conn) {
		tc := serverHandshake(ctx, c, tlsCfg, cfg, "tls")
		if tc == nil {
			return
		}
		up, err := d.DialContext(ctx, "tcp", to)
		if err != nil {
			cfg.Logf("peers: tls: dial %s: %v", to, err)
			c.Close()
			return
		}
		relay(tc, up)
	})
}

// serverHandshake runs the server side of c's TLS handshake, bounded by
// cfg.DialTimeout. On a failure it logs it for the peer named what, closes
// c and returns nil.
func serverHandshake(ctx context.Context, c net.Conn, tlsCfg *tls.Config, cfg Config, what string) *tls.Conn {
	tc := tls.Server(c, tlsCfg)
	hctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		cfg.Logf("peers: %s: handshake with %s: %v", what, c.RemoteAddr(), err)
		c.Close()
		return nil
	}
	return tc
}
