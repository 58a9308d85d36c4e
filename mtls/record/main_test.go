package record

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCert is the one self-signed certificate both sides use, made once:
// benchmarks and fuzz targets reuse it, so no one testing.TB owns it.
var testCert = sync.OnceValues(func() (*tlstest.Leaf, error) {
	return tlstest.NewSelfSigned(tlstest.LeafOptions{CommonName: "record test", Names: []string{"localhost"}})
})

// testConfigs returns mutual-TLS 1.3 configs like HBONE's: client
// certificate required, ALPN h2, no session tickets. They are fresh on each
// call, since tests change them.
func testConfigs(t testing.TB) (client, server *tls.Config) {
	t.Helper()
	leaf, err := testCert()
	if err != nil {
		t.Fatal(err)
	}
	cert := leaf.TLS()
	server = tlstest.ServerConfig(cert, leaf.Pool(), "h2")
	server.SessionTicketsDisabled = true
	return tlstest.ClientConfig(&cert, leaf.Pool(), "localhost", "h2"), server
}

// kind says what runs one end of a test connection.
type kind string

const (
	kindOurs     kind = "ours"     // this package's record layer
	kindFallback kind = "fallback" // this package, forced onto crypto/tls's records
	kindTLS      kind = "tls"      // plain crypto/tls
)

// endpoint is what both *Conn and *tls.Conn offer.
type endpoint interface {
	net.Conn
	HandshakeContext(context.Context) error
	CloseWrite() error
}

func wrap(k kind, raw net.Conn, cfg *tls.Config, client bool) endpoint {
	switch k {
	case kindTLS:
		if client {
			return tls.Client(raw, cfg)
		}
		return tls.Server(raw, cfg)
	default:
		var c *Conn
		if client {
			c = Client(raw, cfg)
		} else {
			c = Server(raw, cfg)
		}
		c.forceFallback = k == kindFallback
		return c
	}
}

// handshakePair runs both handshakes concurrently.
func handshakePair(t testing.TB, cli, srv endpoint) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- srv.HandshakeContext(context.Background()) }()
	cerr := cli.HandshakeContext(context.Background())
	serr := <-errc
	if cerr != nil || serr != nil {
		t.Fatalf("handshake: client %v, server %v", cerr, serr)
	}
}

// pair returns handshaken client and server ends of the given kinds over
// raw (nil: a fresh loopback TCP connection), with configs changed by mod.
func pair(t testing.TB, ck, sk kind, mod func(cli, srv *tls.Config)) (cli, srv endpoint) {
	t.Helper()
	ccfg, scfg := testConfigs(t)
	if mod != nil {
		mod(ccfg, scfg)
	}
	cr, sr := nettest.TCPPair(t)
	cli, srv = wrap(ck, cr, ccfg, true), wrap(sk, sr, scfg, false)
	handshakePair(t, cli, srv)
	t.Cleanup(func() {
		cli.Close()
		srv.Close()
	})
	checkMode(t, cli, ck)
	checkMode(t, srv, sk)
	return cli, srv
}

// checkMode fails the test unless our end uses the record layer its kind
// asks for.
func checkMode(t testing.TB, e endpoint, k kind) {
	t.Helper()
	c, ok := e.(*Conn)
	if !ok {
		return
	}
	if c.fallback != (k == kindFallback) {
		t.Fatalf("%s end: fallback = %v", k, c.fallback)
	}
}
