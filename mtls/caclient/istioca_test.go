package caclient_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/caclient/catest"
)

// waitLimit guards against hangs; it is not a timing assertion.
const waitLimit = 15 * time.Second

func newIstioCA(t *testing.T, srv *catest.Server, mod func(*caclient.IstioCAConfig)) *caclient.IstioCA {
	t.Helper()
	cfg := caclient.IstioCAConfig{Address: srv.Address(), RootCA: srv.TLS().RootFile}
	if mod != nil {
		mod(&cfg)
	}
	ca, err := caclient.NewIstioCA(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close() })
	return ca
}

func TestIstioCAIssuance(t *testing.T) {
	srv := catest.NewServer(t, catest.Options{Token: "jwt-1"})
	tok := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(tok, []byte("jwt-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := newIstioCA(t, srv, func(c *caclient.IstioCAConfig) {
		c.TokenPath, c.ClusterID, c.Headers = tok, "cluster-1", map[string]string{"x-extra": "1"}
	})
	id := identity.New("cluster.local", "ns", "sa")

	for _, tc := range []struct {
		name        string
		impersonate bool
		wantMeta    string
	}{
		{"dedicated: own identity", false, ""},
		{"shared: impersonated", true, id.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(srv.Requests())
			c := caclient.New(caclient.Config{Signer: ca, TTL: time.Hour, Impersonate: tc.impersonate})
			wc, err := c.Fetch(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if wc.Identity != id || len(wc.Certificate.Leaf.URIs) != 1 || wc.Certificate.Leaf.URIs[0].String() != id.String() {
				t.Errorf("issued for %s (URIs %v)", wc.Identity, wc.Certificate.Leaf.URIs)
			}
			if !wc.NotAfter.After(time.Now().Add(59 * time.Minute)) {
				t.Errorf("validity ends %s, want about an hour", wc.NotAfter)
			}
			reqs := srv.Requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("%d requests", len(reqs))
			}
			r := reqs[0]
			if r.CSRIdentity != id || r.TTL != time.Hour || r.Impersonated != tc.wantMeta {
				t.Errorf("request: csr for %s, ttl %s, impersonated %q", r.CSRIdentity, r.TTL, r.Impersonated)
			}
			for k, want := range map[string]string{"authorization": "Bearer jwt-1", "clusterid": "cluster-1", "x-extra": "1"} {
				if got := r.Metadata.Get(k); !slices.Equal(got, []string{want}) {
					t.Errorf("header %s = %v, want %q", k, got, want)
				}
			}
		})
	}
}

func TestIstioCARejections(t *testing.T) {
	srv := catest.NewServer(t, catest.Options{Token: "right"})
	id := identity.New("cluster.local", "ns", "sa")

	wrongToken := newIstioCA(t, srv, func(c *caclient.IstioCAConfig) { c.Token = "wrong" })
	_, err := caclient.New(caclient.Config{Signer: wrongToken}).Fetch(context.Background(), id)
	if !isCode(err, codes.Unauthenticated) {
		t.Errorf("wrong token: %v, want Unauthenticated", err)
	}

	// A CA that issues another identity is refused.
	good := newIstioCA(t, srv, func(c *caclient.IstioCAConfig) { c.Token = "right" })
	srv.IssueAs(identity.New("cluster.local", "ns", "other"))
	_, err = caclient.New(caclient.Config{Signer: good, Impersonate: true}).Fetch(context.Background(), id)
	if !errors.Is(err, mtls.ErrIdentityMismatch) {
		t.Errorf("wrong identity issued: %v, want ErrIdentityMismatch", err)
	}
	srv.IssueAs(identity.Identity{})

	// The CA rejects an impersonation of an identity other than the CSR's;
	// Fetch never sends one, so ask the signer directly.
	if _, err := good.Sign(context.Background(), []byte("not a csr"), time.Hour, id); !isCode(err, codes.InvalidArgument) {
		t.Errorf("bad csr: %v, want InvalidArgument", err)
	}
}

func isCode(err error, c codes.Code) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if s, ok := status.FromError(err); ok && s.Code() == c {
			return true
		}
	}
	return false
}

// echoServer serves TLS from the store's current certificate and echoes.
func echoServer(t *testing.T, store *mtls.Store, id identity.Identity) string {
	t.Helper()
	cfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return store.Get(context.Background(), id) })
	return nettest.Handle(t, tls.NewListener(nettest.Listen(t), cfg), nettest.Echo).Addr.String()
}

func TestIstioCARotationKeepsConnections(t *testing.T) {
	t.Parallel()
	srv := catest.NewServer(t, catest.Options{})
	id := identity.New("cluster.local", "ns", "sa")
	// 2s certificates: refreshed at half-life, about a second in.
	store := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: newIstioCA(t, srv, nil), TTL: 2 * time.Second}), Logf: t.Logf})
	defer store.Close()
	ctx := context.Background()
	first, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, store, id)
	client := mtls.ClientConfig(first, []string{id.String()})
	conn, err := tls.Dial("tcp", addr, client)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitLimit))
	echo := func(c *tls.Conn) {
		t.Helper()
		if err := nettest.RoundTrip(c, "ping"); err != nil {
			t.Fatalf("echo: %v", err)
		}
	}
	echo(conn)

	second := waitNewCert(t, store, id, first)
	if len(srv.Requests()) < 2 {
		t.Errorf("%d CA requests after rotation", len(srv.Requests()))
	}
	// The connection made with the first certificate is unaffected.
	echo(conn)
	// New connections use the new certificate.
	c2, err := tls.Dial("tcp", addr, mtls.ClientConfig(second, []string{id.String()}))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(waitLimit))
	echo(c2)
	if got := c2.ConnectionState().PeerCertificates[0].SerialNumber.String(); got == first.SerialNumber() {
		t.Error("new connection was served the old certificate")
	}
}

// waitNewCert polls the store until it serves a certificate other than old.
func waitNewCert(t *testing.T, store *mtls.Store, id identity.Identity, old *mtls.WorkloadCert) *mtls.WorkloadCert {
	t.Helper()
	var c *mtls.WorkloadCert
	if !nettest.Until(waitLimit, func() bool {
		got, err := store.Get(context.Background(), id)
		c = got
		return err == nil && got.SerialNumber() != old.SerialNumber()
	}) {
		t.Fatal("certificate not rotated")
	}
	return c
}

func TestIstioCAOutage(t *testing.T) {
	t.Parallel()
	srv := catest.NewServer(t, catest.Options{})
	id := identity.New("cluster.local", "ns", "sa")
	// 4s certificates: refreshed about 2s in, then retried after ~1s while
	// the old one, still valid, keeps being served.
	store := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: newIstioCA(t, srv, nil), TTL: 4 * time.Second}), Logf: t.Logf})
	defer store.Close()
	ctx := context.Background()
	cert, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetFailing(status.Error(codes.Unavailable, "istiod is down"))

	// The first issuance, then two failed refreshes.
	if !nettest.Until(waitLimit, func() bool { return len(srv.Requests()) >= 3 }) {
		t.Fatalf("%d CA requests; the store is not retrying", len(srv.Requests()))
	}
	got, err := store.Get(ctx, id)
	if err != nil || got.SerialNumber() != cert.SerialNumber() {
		t.Fatalf("during the outage Get = %v, %v; want the old certificate", got, err)
	}
	srv.SetFailing(nil)
	waitNewCert(t, store, id, cert)
}

// TestIstioCARootFileLate: CA_ROOT_CA names a file not mounted yet. The
// signer is still built (the daemon starts), signing fails saying why, and
// once the file appears the same signer issues: the root file is read at
// each handshake rather than once at start.
func TestIstioCARootFileLate(t *testing.T) {
	srv := catest.NewServer(t, catest.Options{})
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	ca := newIstioCA(t, srv, func(c *caclient.IstioCAConfig) { c.RootCA = path })
	client := caclient.New(caclient.Config{Signer: ca})
	id := identity.New("cluster.local", "ns", "sa")
	if _, err := client.Fetch(context.Background(), id); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("Fetch without the root file = %v, want an error naming the missing file", err)
	}
	root, err := os.ReadFile(srv.TLS().RootFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, root, 0o600); err != nil {
		t.Fatal(err)
	}
	// gRPC reconnects after its own backoff (about a second); the store
	// retries the same way, so poll, bounded.
	if !nettest.Until(waitLimit, func() bool { _, err = client.Fetch(context.Background(), id); return err == nil }) {
		t.Fatalf("Fetch after the root file appeared = %v", err)
	}
}

// TestIstioCAIntermediateRotation is the store's half of istio/istio's
// TestIntermediateCertificateRefresh: once the CA signs through a new
// intermediate, the refreshed certificate carries it as the chain's second
// entry, a peer that trusts only the root accepts it, and a second
// rotation moves the chain on to the next intermediate.
func TestIstioCAIntermediateRotation(t *testing.T) {
	t.Parallel()
	srv := catest.NewServer(t, catest.Options{})
	id := identity.New("cluster.local", "ns", "sa")
	store := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: newIstioCA(t, srv, nil), TTL: 2 * time.Second}), Logf: t.Logf})
	defer store.Close()
	cert, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cert.Certificate.Certificate); n != 1 {
		t.Fatalf("chain of a root-signed leaf has %d certificates, want 1", n)
	}
	addr := echoServer(t, store, id)
	for round := range 2 {
		inter := srv.UseIntermediate(t)
		cert = waitNewCert(t, store, id, cert)
		for cert.Certificate.Leaf.CheckSignatureFrom(inter) != nil {
			// A refresh already under way when the CA rotated is signed by
			// the previous issuer; the next one is the new intermediate's.
			cert = waitNewCert(t, store, id, cert)
		}
		chain := cert.Certificate.Certificate
		if len(chain) != 2 || !bytes.Equal(chain[1], inter.Raw) {
			t.Fatalf("round %d: chain has %d certificates, want [leaf, the new intermediate]", round, len(chain))
		}
		// The server side serves the new chain; a client trusting only the
		// root verifies it through the intermediate it is sent.
		conn, err := tls.Dial("tcp", addr, mtls.ClientConfig(cert, []string{id.String()}))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		_ = conn.SetDeadline(time.Now().Add(waitLimit))
		if err := nettest.RoundTrip(conn, "ping"); err != nil {
			t.Fatalf("round %d: echo: %v", round, err)
		}
		peer := conn.ConnectionState().PeerCertificates
		conn.Close()
		if len(peer) != 2 || !peer[1].Equal(inter) {
			t.Fatalf("round %d: the server sent %d certificates, not the new intermediate", round, len(peer))
		}
	}
}
