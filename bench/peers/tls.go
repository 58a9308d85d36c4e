package peers

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/ztunnel-go/ztunnel/mtls"
)

// TLS terminates mutual TLS 1.3 (the HBONE server config: client
// certificate required, same trust domain) on every connection accepted on
// ln and forwards the plaintext to the address to.
func TLS(ctx context.Context, ln net.Listener, to string, cert *mtls.WorkloadCert, cfg Config) error {
	cfg = cfg.withDefaults()
	tlsCfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil })
	d := cfg.dialer()
	var a acceptor
	return a.serve(ctx, ln, func(ctx context.Context, c net.Conn) {
		tc := tls.Server(c, tlsCfg)
		hctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			cfg.Logf("peers: tls: handshake with %s: %v", c.RemoteAddr(), err)
			c.Close()
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
