package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/state"
)

// Hostile and broken TLS peers on 15008, through the real proxy: each is
// refused with a clear log line, and the proxy keeps serving good clients.

// logBuf collects the proxy's log lines.
type logBuf struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the log holds every one of subs (a hang guard bounds
// it; nothing is timed).
func (b *logBuf) waitFor(t *testing.T, subs ...string) {
	t.Helper()
	var s, missing string
	if !nettest.Until(20*time.Second, func() bool {
		s, missing = b.String(), ""
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				missing = sub
				break
			}
		}
		return missing == ""
	}) {
		t.Fatalf("log never said %q; log:\n%s", missing, s)
	}
}

// withLog sends the proxy's log to b.
func withLog(b *logBuf) func(*Config) {
	return func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(b, nil)) }
}

// dialFrom opens TCP to the rig's 15008 from the loopback address local.
func (r *inboundRig) dialFrom(t *testing.T, local string) net.Conn {
	t.Helper()
	c, err := r.tryDialFrom(t, local)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tryDialFrom is dialFrom for a peer the proxy may refuse so fast (a reset
// right after accept) that connect itself fails.
func (r *inboundRig) tryDialFrom(t *testing.T, local string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.hbonePort))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, nil
}

// tlsClient handshakes over raw; with TLS 1.3 a client learns that the
// server rejected its certificate only on its first read, so one is done: an
// accepted client reads the server's HTTP/2 SETTINGS, a refused one the
// alert.
func tlsClient(raw net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	tc := tls.Client(raw, cfg)
	err := tc.Handshake()
	if err == nil {
		_, err = tc.Read(make([]byte, 1))
	}
	return tc, err
}

// echoFrom runs one HBONE round trip through the proxy to app, from local.
func (r *inboundRig) echoFrom(t *testing.T, local string, app int) error {
	t.Helper()
	cert := tlstest.Cert(t, r.ca, identity.New("", "ns", "client"))
	raw, err := r.tryDialFrom(t, local)
	if err != nil {
		return err
	}
	tc := tls.Client(raw, mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/srv"}))
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{})
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cc.Connect(ctx, &hbone.Request{Authority: fmt.Sprintf("127.0.0.1:%d", app)})
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Write([]byte("good client")); err != nil {
		return err
	}
	_ = s.CloseWrite()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "good client" {
		return fmt.Errorf("echo %q, %v", got, err)
	}
	return nil
}

// craftCert issues a certificate for id from the rig's CA with the given
// validity, bypassing the CA's own checks.
func craftCert(t *testing.T, r *inboundRig, id identity.Identity, notBefore, notAfter time.Time) tls.Certificate {
	t.Helper()
	return tlstest.FromBuiltin(t, r.ca).Leaf(t, tlstest.LeafOptions{
		URIs: []string{id.String()}, NotBefore: notBefore, NotAfter: notAfter,
	}).TLS()
}

func TestInboundRefusesBadTLS(t *testing.T) {
	app := echoApp(t)
	var logs logBuf
	rig := startInbound(t, 1, withLog(&logs))
	client := identity.New("", "ns", "client")
	// peerCfg sends cert whatever CAs the server asks for (crypto/tls
	// would otherwise withhold a certificate from a foreign CA).
	peerCfg := func(cert tls.Certificate) *tls.Config {
		return &tls.Config{
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
			InsecureSkipVerify:   true,
			MinVersion:           tls.VersionTLS13, NextProtos: []string{"h2"},
		}
	}
	for _, tc := range []struct {
		name string
		// try returns the error the peer saw.
		try func(t *testing.T) error
		// logs: what the proxy's log must say ("" when the client refuses).
		logs []string
		// check inspects the peer's error.
		check func(t *testing.T, err error)
	}{
		{
			name: "plaintext HTTP/2",
			try: func(t *testing.T) error {
				c := rig.dialFrom(t, "127.0.0.1")
				_, _ = io.WriteString(c, http2.ClientPreface)
				_, err := io.ReadAll(c)
				if err == nil {
					err = io.EOF
				}
				return err
			},
			logs: []string{"tls handshake", "does not look like a TLS handshake"},
		},
		{
			name: "TLS 1.2 client",
			try: func(t *testing.T) error {
				cfg := peerCfg(tlstest.Cert(t, rig.ca, client).Certificate)
				cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), cfg)
				return err
			},
			logs: []string{"tls handshake", "unsupported versions"},
		},
		{
			// As ztunnel's rustls server (AES-GCM suites only): refused in
			// the handshake with handshake_failure (mtls/suites.go).
			name: "ChaCha20-only client",
			try: func(t *testing.T) error {
				c := rig.dialFrom(t, "127.0.0.1")
				hello, err := tlstest.ClientHello([]uint16{tls.TLS_CHACHA20_POLY1305_SHA256})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Write(hello); err != nil {
					return err
				}
				desc, err := tlstest.ReadAlert(c)
				if err != nil {
					return err
				}
				return fmt.Errorf("alert %d", desc)
			},
			logs: []string{"tls handshake", "no cipher suite supported by both client and server"},
			check: func(t *testing.T, err error) {
				if want := fmt.Sprintf("alert %d", tlstest.AlertHandshakeFailure); err == nil || err.Error() != want {
					t.Fatalf("client saw %v, want %s (handshake_failure)", err, want)
				}
			},
		},
		{
			name: "client without a certificate",
			try: func(t *testing.T) error {
				cfg := peerCfg(tls.Certificate{}) // an empty certificate message
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), cfg)
				return err
			},
			logs: []string{"tls handshake", "didn't provide a certificate"},
		},
		{
			name: "certificate from another trust domain",
			try: func(t *testing.T) error {
				other := tlstest.NewCA(t, "evil.example")
				cert := tlstest.Cert(t, other, identity.New("evil.example", "ns", "client"))
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(cert.Certificate))
				return err
			},
			logs: []string{"tls handshake", "certificate signed by unknown authority"},
		},
		{
			name: "other trust domain signed by our roots",
			try: func(t *testing.T) error {
				now := time.Now()
				cert := craftCert(t, rig, identity.New("evil.example", "ns", "client"), now.Add(-time.Hour), now.Add(time.Hour))
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(cert))
				return err
			},
			logs: []string{"tls handshake", "want trust domain", "cluster.local"},
		},
		{
			name: "expired certificate",
			try: func(t *testing.T) error {
				now := time.Now()
				cert := craftCert(t, rig, client, now.Add(-2*time.Hour), now.Add(-time.Hour))
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(cert))
				return err
			},
			logs: []string{"tls handshake", "expired or is not yet valid"},
		},
		{
			name: "certificate not yet valid",
			try: func(t *testing.T) error {
				now := time.Now()
				cert := craftCert(t, rig, client, now.Add(time.Hour), now.Add(2*time.Hour))
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(cert))
				return err
			},
			logs: []string{"tls handshake", "expired or is not yet valid"},
		},
		{
			name: "CA certificate as the client's",
			try: func(t *testing.T) error {
				leaf := tlstest.FromBuiltin(t, rig.ca).Leaf(t, tlstest.LeafOptions{URIs: []string{client.String()}, CA: true})
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(leaf.TLS()))
				return err
			},
			logs: []string{"tls handshake", "client certificate: mtls: peer certificate is a CA certificate (basic constraints CA:true), not an end entity"},
		},
		{
			name: "upper-case SPIFFE scheme",
			try: func(t *testing.T) error {
				leaf := tlstest.FromBuiltin(t, rig.ca).Leaf(t, tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/ns/sa/client"}})
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), peerCfg(leaf.TLS()))
				return err
			},
			logs: []string{"tls handshake", "client certificate has no spiffe identity, want trust domain"},
		},
		{
			name: "server SAN is not the expected identity",
			try: func(t *testing.T) error {
				cert := tlstest.Cert(t, rig.ca, client)
				cfg := mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/someone-else"})
				_, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), cfg)
				return err
			},
			// The client refuses; the proxy sees the alert.
			logs: []string{"tls handshake", "bad certificate"},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, mtls.ErrIdentityMismatch) {
					t.Fatalf("client error %v, want ErrIdentityMismatch", err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.try(t)
			if err == nil {
				t.Fatal("the peer was not refused")
			}
			t.Logf("peer saw: %v", err)
			if tc.check != nil {
				tc.check(t, err)
			}
			logs.waitFor(t, tc.logs...)
			if err := rig.echoFrom(t, "127.0.0.1", app); err != nil {
				t.Fatalf("good client after the refusal: %v", err)
			}
		})
	}
}

// TestInboundHandshakeTimeout: a peer that connects and says nothing is
// dropped after HandshakeTimeout.
func TestInboundHandshakeTimeout(t *testing.T) {
	app := echoApp(t)
	var logs logBuf
	rig := startInbound(t, 1, withLog(&logs), func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	silent := rig.dialFrom(t, "127.0.0.1")
	if _, err := io.ReadAll(silent); err != nil && !isReset(err) {
		t.Fatalf("silent peer: %v", err)
	}
	logs.waitFor(t, "tls handshake", "deadline exceeded")
	// A good client's handshake is bounded by the same short timeout, which
	// a loaded test machine may exceed: it only has to succeed eventually.
	rig.eventuallyEcho(t, "127.0.0.1", app)
}

// eventuallyEcho retries echoFrom until it succeeds (a hang guard bounds it).
func (r *inboundRig) eventuallyEcho(t *testing.T, local string, app int) {
	t.Helper()
	var err error
	if !nettest.Until(20*time.Second, func() bool { err = r.echoFrom(t, local, app); return err == nil }) {
		t.Fatalf("good client from %s: %v", local, err)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// TestInboundPeerLimits: with the opt-in caps set, one source IP cannot
// hold more than its share of handshakes or connections on 15008 (counted
// in ztunnel_go_hbone_peer_refusals_total); another source is served
// meanwhile, and the first is served again once it lets go.
func TestInboundPeerLimits(t *testing.T) {
	app := echoApp(t)
	for _, tc := range []struct {
		name string
		opt  func(*Config)
		// hold opens what the limit allows from 127.0.0.1.
		hold   func(t *testing.T, rig *inboundRig) []io.Closer
		log    string
		reason string // the metric's
	}{
		{
			name:   "handshakes in progress",
			reason: "handshakes",
			opt:    func(c *Config) { c.MaxHBONEHandshakesPerPeer = 2 },
			hold: func(t *testing.T, rig *inboundRig) []io.Closer {
				// Three silent peers: one of them is refused at once.
				var cs []io.Closer
				errc := make(chan error, 3)
				d := net.Dialer{Timeout: 10 * time.Second}
				for range 3 {
					c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", rig.hbonePort))
					if err != nil {
						errc <- err // refused before connect returned
						continue
					}
					cs = append(cs, c)
					go func() {
						_, err := io.ReadAll(c)
						errc <- err
					}()
				}
				<-errc // the refused one
				t.Cleanup(func() {
					for _, c := range cs {
						c.Close()
					}
					<-errc
					<-errc
				})
				return cs
			},
			log: "TLS handshakes in progress from 127.0.0.1",
		},
		{
			name:   "connections",
			reason: "connections",
			opt:    func(c *Config) { c.MaxHBONEConnsPerPeer = 2 },
			hold: func(t *testing.T, rig *inboundRig) []io.Closer {
				cert := tlstest.Cert(t, rig.ca, identity.New("", "ns", "client"))
				cfg := mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/srv"})
				var cs []io.Closer
				for range 2 {
					tc, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), cfg)
					if err != nil {
						t.Fatal(err)
					}
					cs = append(cs, tc)
				}
				if raw, err := rig.tryDialFrom(t, "127.0.0.1"); err == nil {
					if _, err := tlsClient(raw, cfg); err == nil {
						t.Fatal("a third connection was let in")
					}
				}
				return cs
			},
			log: "2 connections from 127.0.0.1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuf
			m := metrics.New(metrics.Config{})
			rig := startInbound(t, 1, withLog(&logs), tc.opt, func(c *Config) { c.Metrics = m })
			held := tc.hold(t, rig)
			logs.waitFor(t, "per-peer limit", tc.log)
			if n := counterOf(t, m, "ztunnel_go_hbone_peer_refusals_total", "reason", tc.reason); n < 1 {
				t.Errorf("refusals counted %v, want at least 1 for reason %s", n, tc.reason)
			}
			if err := rig.echoFrom(t, "127.0.0.2", app); err != nil {
				t.Fatalf("another source during the flood: %v", err)
			}
			for _, c := range held {
				c.Close()
			}
			// The proxy notices the closes on its own time; the first source
			// is served again once it has.
			rig.eventuallyEcho(t, "127.0.0.1", app)
		})
	}
}

// TestInboundNoPeerCapByDefault: as ztunnel, 15008 has no per-source cap
// unless one is set: every cross-network connection to a pod comes from its
// east-west gateway's one address. More connections from one source than
// the old default caps allowed handshakes are served.
func TestInboundNoPeerCapByDefault(t *testing.T) {
	app := echoApp(t)
	rig := startInbound(t, 1)
	cert := tlstest.Cert(t, rig.ca, identity.New("", "ns", "client"))
	cfg := mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/ns/sa/srv"})
	for i := range 160 { // over the 128 handshakes the old default allowed
		tc, err := tlsClient(rig.dialFrom(t, "127.0.0.1"), cfg)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer tc.Close()
	}
	if err := rig.echoFrom(t, "127.0.0.1", app); err != nil {
		t.Fatal(err)
	}
}

// counterOf is the value of family's sample with label = value.
func counterOf(t *testing.T, m *metrics.Metrics, family, label, value string) float64 {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestInboundFirstURIDecides: of a client certificate's URI SANs, the first
// that parses as a SPIFFE identity (as written: "SPIFFE://" does not, empty
// segments do) is the peer's identity, as ztunnel reads it; an ALLOW policy
// for namespace ns then judges that identity, not a later one.
func TestInboundFirstURIDecides(t *testing.T) {
	app := echoApp(t)
	var logs logBuf
	rig := startInbound(t, 1, withLog(&logs))
	old := rig.store.Load()
	allow := &state.Policy{
		Name: "allow-ns", Namespace: "ns", Scope: state.ScopeNamespace, Action: state.ActionAllow,
		Rules: [][][]state.Match{{{{Namespaces: []state.StringMatch{{Kind: state.MatchExact, Value: "ns"}}}}}},
	}
	next, err := state.NewSnapshot(old.Workloads(), old.Services(), append(append([]*state.Policy(nil), old.Policies()...), allow))
	if err != nil {
		t.Fatal(err)
	}
	rig.store.Publish(next)
	ca := tlstest.FromBuiltin(t, rig.ca)
	const inNS = "spiffe://cluster.local/ns/ns/sa/client"

	for _, tc := range []struct {
		name string
		leaf tlstest.LeafOptions
		// want is the CONNECT's status: a 401 means the policy judged an
		// identity outside ns, which only the first SPIFFE URI is.
		want int
	}{
		{name: "one URI in the namespace", leaf: tlstest.LeafOptions{URIs: []string{inNS}}, want: 200},
		{name: "non-SPIFFE first URI is skipped", leaf: tlstest.LeafOptions{URIs: []string{"https://example.com/ns/x/sa/y", inNS}}, want: 200},
		{
			name: "empty namespace first decides", leaf: tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns//sa/client", inNS}},
			want: 401,
		},
		{
			name: "upper-case first URI is no identity", leaf: tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/ns/sa/client", "spiffe://cluster.local/ns/other/sa/client"}},
			want: 401,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf := ca.Leaf(t, tc.leaf)
			cert := leaf.TLS()
			tc0 := tls.Client(rig.dialFrom(t, "127.0.0.1"), &tls.Config{
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
				InsecureSkipVerify:   true,
				MinVersion:           tls.VersionTLS13, NextProtos: []string{"h2"},
			})
			if err := tc0.Handshake(); err != nil {
				t.Fatal(err)
			}
			cc, err := hbone.NewClientConn(tc0, hbone.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := cc.Connect(ctx, &hbone.Request{Authority: fmt.Sprintf("127.0.0.1:%d", app)})
			if tc.want == 200 {
				if err != nil {
					t.Fatalf("CONNECT: %v, want 200", err)
				}
				s.Close()
				return
			}
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.want {
				t.Fatalf("CONNECT: %v, want status %d", err, tc.want)
			}
			logs.waitFor(t, "policy rejection")
		})
	}
}
