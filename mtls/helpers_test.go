package mtls_test

import (
	"crypto"
	"crypto/tls"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
)

func TestMain(m *testing.M) {
	if code, ok := suiteHelper(); ok { // suites_test.go: a crypto/tls peer
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
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
	c, sc := nettest.TCPPair(t)
	type side struct {
		cs  tls.ConnectionState
		err error
	}
	srvCh := make(chan side, 1)
	go func() {
		defer sc.Close()
		_ = sc.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(sc, srvCfg)
		err := tc.Handshake()
		if err == nil {
			_, err = tc.Write([]byte{'x'})
		}
		srvCh <- side{tc.ConnectionState(), err}
	}()

	var r hsResult
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
