package mtls_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

func TestMain(m *testing.M) {
	if code, ok := suiteHelper(); ok { // suites_test.go: a crypto/tls peer
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}

// testCA is a hand-built CA for chains the built-in CA will not make:
// intermediates, extra roots, DNS SANs, expired leaves, several trust domains.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var serial atomic.Int64

func nextSerial() *big.Int {
	return big.NewInt(serial.Add(1))
}

// newTestRoot returns a self-signed root naming uris (e.g. "spiffe://td").
func newTestRoot(t testing.TB, uris ...string) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: "test root"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
		URIs:                  parseURIs(t, uris),
	}
	return signCA(t, tmpl, key, tmpl, key)
}

// intermediate returns a CA signed by ca.
func (ca *testCA) intermediate(t testing.TB) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: "test intermediate"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	return signCA(t, tmpl, key, ca.cert, ca.key)
}

func signCA(t testing.TB, tmpl *x509.Certificate, key *ecdsa.PrivateKey, parent *x509.Certificate, parentKey crypto.Signer) *testCA {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: c, key: key, pem: pemCert(der)}
}

// leafOpts shapes a leaf from a testCA.
type leafOpts struct {
	uris      []string
	dnsNames  []string
	notBefore time.Time // zero: an hour ago
	notAfter  time.Time // zero: in a day
}

// leaf signs a leaf for key's public half and returns its PEM.
func (ca *testCA) leaf(t testing.TB, key crypto.Signer, o leafOpts) string {
	t.Helper()
	if o.notBefore.IsZero() {
		o.notBefore = time.Now().Add(-time.Hour)
	}
	if o.notAfter.IsZero() {
		o.notAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		NotBefore:    o.notBefore,
		NotAfter:     o.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         parseURIs(t, o.uris),
		DNSNames:     o.dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pemCert(der)
}

// builtin loads the testCA as a caclient.BuiltinCA, for issuing through the
// real client path from a root the test shaped.
func (ca *testCA) builtin(t testing.TB) *caclient.BuiltinCA {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := caclient.LoadBuiltinCA([]byte(ca.pem), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseURIs(t testing.TB, ss []string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func mustParse(t testing.TB, chain []string, key crypto.Signer, id identity.Identity) *mtls.WorkloadCert {
	t.Helper()
	c, err := mtls.ParseChain(chain, key, id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hsResult is what each side of one handshake saw.
type hsResult struct {
	srv, cli       tls.ConnectionState
	srvErr, cliErr error
}

// handshake runs one TLS handshake over loopback TCP. After a successful
// handshake the server writes a byte and the client reads it, so the client
// also processes what the server sends after its Finished (session tickets,
// or the alert for a rejected client certificate, which in TLS 1.3 arrives
// after the client's Handshake has returned).
func handshake(t testing.TB, srvCfg, cliCfg *tls.Config) hsResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type side struct {
		cs  tls.ConnectionState
		err error
	}
	srvCh := make(chan side, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvCh <- side{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, srvCfg)
		err = tc.Handshake()
		if err == nil {
			_, err = tc.Write([]byte{'x'})
		}
		srvCh <- side{tc.ConnectionState(), err}
	}()

	var r hsResult
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, cliCfg)
	r.cliErr = tc.Handshake()
	if r.cliErr == nil {
		var b [1]byte
		_, r.cliErr = tc.Read(b[:])
	}
	r.cli = tc.ConnectionState()
	if r.cliErr != nil {
		c.Close() // unblock a server still waiting for our flight
	}
	s := <-srvCh
	r.srv, r.srvErr = s.cs, s.err
	return r
}
