package record

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCert is one self-signed certificate both sides use, made once.
var testCert = sync.OnceValues(func() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "record test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
})

// testConfigs returns mutual-TLS 1.3 configs like HBONE's: client
// certificate required, ALPN h2, no session tickets.
func testConfigs(t testing.TB) (client, server *tls.Config) {
	t.Helper()
	cert, err := testCert()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	server = &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{cert},
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              pool,
		NextProtos:             []string{"h2"},
		SessionTicketsDisabled: true,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   "localhost",
		NextProtos:   []string{"h2"},
	}
	return client, server
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		cc.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() {
		cc.Close()
		r.c.Close()
	})
	return cc.(*net.TCPConn), r.c.(*net.TCPConn)
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
	cr, sr := tcpPair(t)
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
