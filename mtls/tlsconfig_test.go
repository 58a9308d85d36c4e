package mtls_test

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

var (
	serverID = identity.New("", "ns-a", "server")
	clientID = identity.New("", "ns-b", "client")
)

func static(c *mtls.WorkloadCert) func() (*mtls.WorkloadCert, error) {
	return func() (*mtls.WorkloadCert, error) { return c, nil }
}

func TestHandshake(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	srvCert := tlstest.Cert(t, ca, serverID)
	cliCert := tlstest.Cert(t, ca, clientID)

	r := handshake(t, mtls.ServerConfig(static(srvCert)), mtls.ClientConfig(cliCert, []string{"spiffe://cluster.local/ns/x/sa/y", serverID.String()}))
	if r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("handshake failed: server %v, client %v", r.srvErr, r.cliErr)
	}
	for side, cs := range map[string]tls.ConnectionState{"server": r.srv, "client": r.cli} {
		if cs.Version != tls.VersionTLS13 {
			t.Errorf("%s: version %x, want TLS 1.3", side, cs.Version)
		}
		if cs.NegotiatedProtocol != "h2" {
			t.Errorf("%s: ALPN %q, want h2", side, cs.NegotiatedProtocol)
		}
	}
	if r.srv.ServerName != "" {
		t.Errorf("client sent SNI %q, want none", r.srv.ServerName)
	}
	if got, err := mtls.PeerIdentity(r.srv); err != nil || got != clientID {
		t.Errorf("server's PeerIdentity = %v, %v; want %v", got, err, clientID)
	}
	if got, err := mtls.PeerIdentity(r.cli); err != nil || got != serverID {
		t.Errorf("client's PeerIdentity = %v, %v; want %v", got, err, serverID)
	}
}

func TestServerRejects(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	srvCert := tlstest.Cert(t, ca, serverID)
	other := tlstest.NewCA(t, "cluster.local")

	// One root signing for two trust domains, so that the foreign-domain
	// client passes the chain check and meets the trust-domain rule.
	multi := tlstest.NewRoot(t, tlstest.CAOptions{TrustDomains: []string{"cluster.local", "other.td"}}).Builtin(t)
	multiSrv := tlstest.Cert(t, multi, serverID)
	foreignID := identity.New("other.td", "ns-b", "client")

	tests := []struct {
		name  string
		srv   *mtls.WorkloadCert
		cli   func() *tls.Config
		check func(error) bool
	}{
		{
			name: "no client certificate",
			srv:  srvCert,
			cli: func() *tls.Config {
				cfg := mtls.ClientConfig(tlstest.Cert(t, ca, clientID), []string{serverID.String()})
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					return &tls.Certificate{}, nil
				}
				return cfg
			},
			check: func(err error) bool { return strings.Contains(err.Error(), "didn't provide a certificate") },
		},
		{
			name: "client certificate from another CA",
			srv:  srvCert,
			cli: func() *tls.Config {
				// The client trusts both roots, so only the server can object.
				oc := tlstest.Cert(t, other, clientID)
				both := mustParse(t, []string{oc.ChainPEM[0], string(oc.RootsPEM) + string(ca.RootPEM())},
					oc.Certificate.PrivateKey.(crypto.Signer), clientID)
				return mtls.ClientConfig(both, []string{serverID.String()})
			},
			check: func(err error) bool {
				var ua x509.UnknownAuthorityError
				return errors.As(err, &ua)
			},
		},
		{
			name: "client in another trust domain",
			srv:  multiSrv,
			cli: func() *tls.Config {
				return mtls.ClientConfig(tlstest.Cert(t, multi, foreignID), []string{serverID.String()})
			},
			check: func(err error) bool { return errors.Is(err, mtls.ErrTrustDomain) },
		},
		{
			name: "TLS 1.2 only client",
			srv:  srvCert,
			cli: func() *tls.Config {
				cfg := mtls.ClientConfig(tlstest.Cert(t, ca, clientID), []string{serverID.String()})
				cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
				return cfg
			},
			check: func(err error) bool { return strings.Contains(err.Error(), "unsupported versions") },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := handshake(t, mtls.ServerConfig(static(tc.srv)), tc.cli())
			if r.srvErr == nil {
				t.Fatal("server accepted the client")
			}
			if !tc.check(r.srvErr) {
				t.Fatalf("server error %v is not the expected one", r.srvErr)
			}
			if r.cliErr == nil {
				t.Fatal("client did not see the rejection")
			}
		})
	}

	// The control: the same multi-domain CA with a client in our domain.
	r := handshake(t, mtls.ServerConfig(static(multiSrv)), mtls.ClientConfig(tlstest.Cert(t, multi, clientID), []string{serverID.String()}))
	if r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("same-domain client rejected: server %v, client %v", r.srvErr, r.cliErr)
	}
}

func TestServerCertError(t *testing.T) {
	boom := errors.New("no cert yet")
	ca := tlstest.NewCA(t, "")
	srv := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return nil, boom })
	r := handshake(t, srv, mtls.ClientConfig(tlstest.Cert(t, ca, clientID), []string{serverID.String()}))
	if !errors.Is(r.srvErr, boom) || r.cliErr == nil {
		t.Fatalf("server %v, client %v; want the cert error to fail the handshake", r.srvErr, r.cliErr)
	}
}

func TestClientRejects(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	srvCert := tlstest.Cert(t, ca, serverID)
	cliCert := tlstest.Cert(t, ca, clientID)
	otherSrv := tlstest.Cert(t, tlstest.NewCA(t, "cluster.local"), serverID)

	// A server leaf with a DNS SAN as well, to show DNS names never match.
	root := tlstest.NewRoot(t, tlstest.CAOptions{TrustDomains: []string{"cluster.local"}})
	rootCA := root.Builtin(t)
	key := tlstest.NewKey(t)
	dnsSrv := mustParse(t, []string{
		string(root.Leaf(t, tlstest.LeafOptions{Key: key, URIs: []string{serverID.String()}, Names: []string{"server.example"}}).PEM()),
		string(root.PEM()),
	}, key, serverID)
	dnsCli := tlstest.Cert(t, rootCA, clientID)

	tests := []struct {
		name     string
		srv, cli *mtls.WorkloadCert
		expected []string
		check    func(error) bool
	}{
		{
			name: "server SAN not expected", srv: srvCert, cli: cliCert,
			expected: []string{"spiffe://cluster.local/ns/ns-a/sa/other"},
			check:    func(err error) bool { return errors.Is(err, mtls.ErrIdentityMismatch) },
		},
		{
			name: "no expected SANs", srv: srvCert, cli: cliCert,
			check: func(err error) bool { return errors.Is(err, mtls.ErrIdentityMismatch) },
		},
		{
			name: "server certificate from another CA", srv: otherSrv, cli: cliCert,
			expected: []string{serverID.String()},
			check: func(err error) bool {
				var ua x509.UnknownAuthorityError
				return errors.As(err, &ua)
			},
		},
		{
			name: "DNS SAN is ignored", srv: dnsSrv, cli: dnsCli,
			expected: []string{"server.example"},
			check:    func(err error) bool { return errors.Is(err, mtls.ErrIdentityMismatch) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := handshake(t, mtls.ServerConfig(static(tc.srv)), mtls.ClientConfig(tc.cli, tc.expected))
			if r.cliErr == nil {
				t.Fatal("client accepted the server")
			}
			if !tc.check(r.cliErr) {
				t.Fatalf("client error %v is not the expected one", r.cliErr)
			}
		})
	}
}

// recordingCache is a ClientSessionCache that counts the tickets it is
// given.
type recordingCache struct {
	mu   sync.Mutex
	puts int
}

func (c *recordingCache) Get(string) (*tls.ClientSessionState, bool) { return nil, false }

func (c *recordingCache) Put(_ string, cs *tls.ClientSessionState) {
	if cs == nil {
		return
	}
	c.mu.Lock()
	c.puts++
	c.mu.Unlock()
}

func TestNoSessionResumption(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	srvCert := tlstest.Cert(t, ca, serverID)
	cliCert := tlstest.Cert(t, ca, clientID)

	t.Run("server issues no ticket", func(t *testing.T) {
		// A client that would keep tickets, to observe the server.
		cache := &recordingCache{}
		cli := mtls.ClientConfig(cliCert, []string{serverID.String()})
		cli.SessionTicketsDisabled = false
		cli.ClientSessionCache = cache
		srv := mtls.ServerConfig(static(srvCert))
		for i := range 2 {
			r := handshake(t, srv, cli)
			if r.srvErr != nil || r.cliErr != nil {
				t.Fatalf("dial %d: server %v, client %v", i, r.srvErr, r.cliErr)
			}
			if r.cli.DidResume || r.srv.DidResume {
				t.Fatalf("dial %d resumed", i)
			}
		}
		if cache.puts != 0 {
			t.Fatalf("server issued %d session tickets", cache.puts)
		}
	})

	t.Run("client does not resume", func(t *testing.T) {
		// A server that issues tickets, to observe the client.
		srv := &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{srvCert.Certificate},
			ClientAuth:   tls.RequireAnyClientCert,
			NextProtos:   []string{"h2"},
		}
		cli := mtls.ClientConfig(cliCert, []string{serverID.String()})
		for i := range 2 {
			r := handshake(t, srv, cli)
			if r.srvErr != nil || r.cliErr != nil {
				t.Fatalf("dial %d: server %v, client %v", i, r.srvErr, r.cliErr)
			}
			if r.cli.DidResume {
				t.Fatalf("dial %d resumed", i)
			}
		}
		if cli.ClientSessionCache != nil {
			t.Fatal("ClientConfig has a session cache")
		}
	})
}

// TestServerRotation shows that the server's certificate function is asked
// on every handshake, so a rotated certificate is served at once.
func TestServerRotation(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	var cur atomic.Pointer[mtls.WorkloadCert]
	first := tlstest.Cert(t, ca, serverID)
	cur.Store(first)
	srv := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cur.Load(), nil })
	cli := mtls.ClientConfig(tlstest.Cert(t, ca, clientID), []string{serverID.String()})

	serial := func() string {
		t.Helper()
		r := handshake(t, srv, cli)
		if r.srvErr != nil || r.cliErr != nil {
			t.Fatalf("server %v, client %v", r.srvErr, r.cliErr)
		}
		return r.cli.PeerCertificates[0].SerialNumber.String()
	}
	if got := serial(); got != first.SerialNumber() {
		t.Fatalf("served serial %s, want %s", got, first.SerialNumber())
	}
	second := tlstest.Cert(t, ca, serverID)
	cur.Store(second)
	if got := serial(); got != second.SerialNumber() {
		t.Fatalf("after rotation served serial %s, want %s", got, second.SerialNumber())
	}
}

func TestPeerIdentityErrors(t *testing.T) {
	if _, err := mtls.PeerIdentity(tls.ConnectionState{}); !errors.Is(err, mtls.ErrNoIdentity) {
		t.Fatalf("empty state: %v, want ErrNoIdentity", err)
	}
	root := tlstest.NewRoot(t, tlstest.CAOptions{})
	key := tlstest.NewKey(t)
	leaf := root.Leaf(t, tlstest.LeafOptions{Key: key, URIs: []string{"https://example.com/x"}, Names: []string{"a.example"}}).Cert
	cs := tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{leaf}}
	if _, err := mtls.PeerIdentity(cs); !errors.Is(err, mtls.ErrNoIdentity) {
		t.Fatalf("non-spiffe leaf: %v, want ErrNoIdentity", err)
	}
}

// BenchmarkHandshake measures one complete mTLS handshake, both sides, over
// loopback TCP per op (TCP connect included).
func BenchmarkHandshake(b *testing.B) {
	ca := tlstest.NewCA(b, "cluster.local")
	srv := mtls.ServerConfig(static(tlstest.Cert(b, ca, serverID)))
	cli := mtls.ClientConfig(tlstest.Cert(b, ca, clientID), []string{serverID.String()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			err = tls.Server(c, srv).Handshake()
			c.Close()
			done <- err
		}
	}()
	b.Cleanup(func() {
		ln.Close()
		for range done {
		}
	})
	addr := ln.Addr().String()
	b.ReportAllocs()
	for b.Loop() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		if err := tls.Client(c, cli).Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
