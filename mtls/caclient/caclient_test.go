package caclient_test

import (
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var id = identity.New("", "ns", "sa")

// recordingSigner records what Client sends and passes it to a real CA.
type recordingSigner struct {
	ca          caclient.Signer
	csrPEM      []byte
	ttl         time.Duration
	impersonate identity.Identity
}

func (r *recordingSigner) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration, imp identity.Identity) ([]string, error) {
	r.csrPEM, r.ttl, r.impersonate = csrPEM, ttl, imp
	return r.ca.Sign(ctx, csrPEM, ttl, imp)
}

func parseCSR(t testing.TB, p []byte) *x509.CertificateRequest {
	t.Helper()
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatalf("CSR is not a PEM CERTIFICATE REQUEST: %q", p)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func TestClientCSR(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	for _, imp := range []bool{false, true} {
		rec := &recordingSigner{ca: ca}
		c := caclient.New(caclient.Config{Signer: rec, Impersonate: imp})
		wc, err := c.Fetch(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if wc.Identity != id {
			t.Fatalf("issued %v, want %v", wc.Identity, id)
		}
		csr := parseCSR(t, rec.csrPEM)
		if err := csr.CheckSignature(); err != nil {
			t.Fatal(err)
		}
		if csr.Subject.CommonName != "" || len(csr.Subject.Names) != 0 {
			t.Errorf("CSR subject %v, want empty (no CN)", csr.Subject)
		}
		if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() {
			t.Errorf("CSR URI SANs %v, want exactly [%v]", csr.URIs, id)
		}
		if len(csr.DNSNames)+len(csr.EmailAddresses)+len(csr.IPAddresses) != 0 {
			t.Errorf("CSR has other SANs: %v %v %v", csr.DNSNames, csr.EmailAddresses, csr.IPAddresses)
		}
		if csr.SignatureAlgorithm != x509.ECDSAWithSHA256 {
			t.Errorf("CSR signed with %v, want ECDSA-SHA256", csr.SignatureAlgorithm)
		}
		if pub, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
			t.Errorf("CSR key %T, want ECDSA P-256", csr.PublicKey)
		}
		if rec.ttl != caclient.DefaultTTL {
			t.Errorf("requested ttl %v, want %v", rec.ttl, caclient.DefaultTTL)
		}
		wantImp := identity.Identity{}
		if imp {
			wantImp = id
		}
		if rec.impersonate != wantImp {
			t.Errorf("Impersonate=%v sent %v, want %v", imp, rec.impersonate, wantImp)
		}
	}
}

// lyingSigner answers every CSR with a certificate for another identity.
type lyingSigner struct{ ca *caclient.BuiltinCA }

func (l lyingSigner) Sign(ctx context.Context, _ []byte, ttl time.Duration, _ identity.Identity) ([]string, error) {
	_, csr := csrFor(nil, []string{"spiffe://cluster.local/ns/ns/sa/someone-else"}, nil)
	return l.ca.Sign(ctx, csr, ttl, identity.Identity{})
}

type failingSigner struct{}

var errSigner = errors.New("ca unavailable")

func (failingSigner) Sign(context.Context, []byte, time.Duration, identity.Identity) ([]string, error) {
	return nil, errSigner
}

func TestClientErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	if _, err := caclient.New(caclient.Config{Signer: lyingSigner{ca}}).Fetch(context.Background(), id); !errors.Is(err, mtls.ErrIdentityMismatch) {
		t.Fatalf("CA answering for another identity: %v, want ErrIdentityMismatch", err)
	}
	if _, err := caclient.New(caclient.Config{Signer: failingSigner{}}).Fetch(context.Background(), id); !errors.Is(err, errSigner) {
		t.Fatalf("signer error not wrapped: %v", err)
	}
	if _, err := caclient.New(caclient.Config{Signer: ca}).Fetch(context.Background(), identity.Identity{}); err == nil {
		t.Fatal("fetch for the zero identity succeeded")
	}
}

// csrFor builds a CSR with the given SANs. A nil key means a fresh P-256 key.
func csrFor(key crypto.Signer, uris, dns []string) (crypto.Signer, []byte) {
	if key == nil {
		key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	tmpl := &x509.CertificateRequest{DNSNames: dns}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			panic(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		panic(err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestBuiltinCASign(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	_, good := csrFor(nil, []string{id.String()}, nil)

	// A valid CSR whose signature no longer matches: flip the last byte, which
	// lies inside the signature.
	block, _ := pem.Decode(good)
	tampered := append([]byte(nil), block.Bytes...)
	tampered[len(tampered)-1] ^= 0xff
	badSig := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: tampered})

	mustCSR := func(uris, dns []string) []byte { _, p := csrFor(nil, uris, dns); return p }
	tests := []struct {
		name        string
		csr         []byte
		impersonate identity.Identity
		wantErr     string
	}{
		{name: "valid", csr: good},
		{name: "valid impersonation", csr: good, impersonate: id},
		{name: "two URI SANs", csr: mustCSR([]string{id.String(), "spiffe://cluster.local/ns/ns/sa/b"}, nil), wantErr: "2 URI SANs"},
		{name: "DNS SAN besides the URI", csr: mustCSR([]string{id.String()}, []string{"a.example"}), wantErr: "DNS, email or IP"},
		{name: "DNS SAN only", csr: mustCSR(nil, []string{"a.example"}), wantErr: "DNS, email or IP"},
		{name: "no SAN", csr: mustCSR(nil, nil), wantErr: "0 URI SANs"},
		{name: "bad signature", csr: badSig, wantErr: "bad signature"},
		{name: "foreign trust domain", csr: mustCSR([]string{"spiffe://evil.example/ns/ns/sa/sa"}, nil), wantErr: "trust domain"},
		{name: "impersonation mismatch", csr: good, impersonate: identity.New("", "ns", "other"), wantErr: "impersonating"},
		{name: "not spiffe", csr: mustCSR([]string{"https://cluster.local/ns/ns/sa/sa"}, nil), wantErr: "malformed"},
		{name: "spiffe with a query", csr: mustCSR([]string{"spiffe://cluster.local/ns/ns/sa/sa?x=1"}, nil), wantErr: "characters"},
		{name: "spiffe with a port", csr: mustCSR([]string{"spiffe://cluster.local:1/ns/ns/sa/sa"}, nil), wantErr: "characters"},
		{name: "garbage", csr: []byte("hello"), wantErr: "no PEM block"},
		{name: "wrong PEM type", csr: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), wantErr: "not a CERTIFICATE REQUEST"},
		{name: "undecodable CSR", csr: []byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), wantErr: "csr rejected"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			chain, err := ca.Sign(context.Background(), tc.csr, time.Hour, tc.impersonate)
			if tc.wantErr != "" {
				if !errors.Is(err, caclient.ErrCSRRejected) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want ErrCSRRejected containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkLeaf(t, ca, chain, time.Hour)
		})
	}
}

// checkLeaf checks the shape of a [leaf, root] answer issued for ttl.
func checkLeaf(t *testing.T, ca *caclient.BuiltinCA, chain []string, ttl time.Duration) *x509.Certificate {
	t.Helper()
	if len(chain) != 2 || chain[1] != string(ca.RootPEM()) {
		t.Fatalf("chain has %d entries or the wrong root", len(chain))
	}
	block, _ := pem.Decode([]byte(chain[0]))
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.RootPEM())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	if leaf.IsCA || leaf.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment {
		t.Errorf("leaf IsCA=%v KeyUsage=%v", leaf.IsCA, leaf.KeyUsage)
	}
	if len(leaf.ExtKeyUsage) != 2 {
		t.Errorf("ExtKeyUsage %v, want server and client auth", leaf.ExtKeyUsage)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || len(leaf.DNSNames) != 0 {
		t.Errorf("leaf SANs %v %v, want only %v", leaf.URIs, leaf.DNSNames, id)
	}
	if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %v is not a positive 128-bit number", leaf.SerialNumber)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life < ttl || life > ttl+time.Minute+time.Second {
		t.Errorf("validity %v, want ttl %v plus at most a minute of backdating", life, ttl)
	}
	if d := time.Until(leaf.NotAfter); d > ttl+time.Second || d < ttl-time.Minute {
		t.Errorf("NotAfter %v from now, want about %v", d, ttl)
	}
	return leaf
}

func TestBuiltinCASignLimits(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	_, csr := csrFor(nil, []string{id.String()}, nil)

	// Capped at the root's expiry.
	chain, err := ca.Sign(context.Background(), csr, 20*365*24*time.Hour, identity.Identity{})
	if err != nil {
		t.Fatal(err)
	}
	root, _ := pem.Decode(ca.RootPEM())
	rc, _ := x509.ParseCertificate(root.Bytes)
	leafBlock, _ := pem.Decode([]byte(chain[0]))
	lc, _ := x509.ParseCertificate(leafBlock.Bytes)
	if !lc.NotAfter.Equal(rc.NotAfter) {
		t.Fatalf("leaf NotAfter %v, want the root's %v", lc.NotAfter, rc.NotAfter)
	}

	// A short TTL keeps its refresh point ahead of now.
	chain, err = ca.Sign(context.Background(), csr, 2*time.Second, identity.Identity{})
	if err != nil {
		t.Fatal(err)
	}
	leafBlock, _ = pem.Decode([]byte(chain[0]))
	lc, _ = x509.ParseCertificate(leafBlock.Bytes)
	if mid := lc.NotBefore.Add(lc.NotAfter.Sub(lc.NotBefore) / 2); !mid.After(time.Now()) {
		t.Fatalf("2s certificate's half-life %v is already past", mid)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ca.Sign(ctx, csr, time.Hour, identity.Identity{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sign with a cancelled context: %v", err)
	}
}

func TestLoadBuiltinCARoundTrip(t *testing.T) {
	orig := tlstest.NewCA(t, "example.org")
	loaded, err := caclient.LoadBuiltinCA(orig.RootPEM(), orig.KeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	if got := loaded.TrustDomains(); len(got) != 1 || got[0] != "example.org" {
		t.Fatalf("loaded trust domains %v, want [example.org]", got)
	}
	if string(loaded.RootPEM()) != string(orig.RootPEM()) {
		t.Fatal("loaded root differs")
	}
	if block, _ := pem.Decode(orig.KeyPEM()); block == nil || block.Type != "PRIVATE KEY" {
		t.Fatal("KeyPEM is not PKCS#8")
	}
	tdID := identity.New("example.org", "ns", "sa")
	wc, err := caclient.New(caclient.Config{Signer: loaded}).Fetch(context.Background(), tdID)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(orig.RootPEM())
	if _, err := wc.Certificate.Leaf.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Fatalf("certificate from the loaded CA does not verify against the original root: %v", err)
	}
}

// makeCA is a hand-made CA for cluster.local (in its Organization) valid
// for an hour, shaped further by mod.
func makeCA(t *testing.T, key crypto.Signer, mod func(*x509.Certificate)) *tlstest.CA {
	t.Helper()
	return tlstest.NewRoot(t, tlstest.CAOptions{
		CommonName: "ca", Organization: []string{"cluster.local"}, KeyUsage: x509.KeyUsageCertSign,
		NotAfter: time.Now().Add(time.Hour), Key: key, Modify: mod,
	})
}

func TestLoadBuiltinCAInputs(t *testing.T) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	good := makeCA(t, ecKey, nil)
	goodKey := good.KeyPEM(t)
	other := tlstest.NewCA(t, "")
	sec1, _ := x509.MarshalECPrivateKey(ecKey)
	xKey, _ := ecdh.X25519().GenerateKey(rand.Reader)
	xDER, _ := x509.MarshalPKCS8PrivateKey(xKey)
	rsaCA := makeCA(t, rsaKey, nil)
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)})

	tests := []struct {
		name      string
		cert, key []byte
		wantErr   string // "" means it loads
		wantTDs   string
	}{
		{name: "PKCS#8 ECDSA, trust domain from Organization", cert: good.PEM(), key: goodKey, wantTDs: "cluster.local"},
		{name: "SEC 1 key after EC PARAMETERS", cert: good.PEM(),
			key: append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}}),
				pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})...), wantTDs: "cluster.local"},
		{name: "PKCS#1 RSA", cert: rsaCA.PEM(), key: pkcs1, wantTDs: "cluster.local"},
		{name: "trust domains from URI SANs win", key: goodKey, wantTDs: "a.example,b.example",
			cert: makeCA(t, ecKey, func(c *x509.Certificate) {
				c.URIs = []*url.URL{{Scheme: "spiffe", Host: "a.example"}, {Scheme: "spiffe", Host: "b.example"}}
			}).PEM()},
		{name: "garbage certificate", cert: []byte("nope"), key: goodKey, wantErr: "no PEM CERTIFICATE block"},
		{name: "undecodable certificate", cert: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), key: goodKey, wantErr: "CA certificate"},
		{name: "two certificates", cert: append(append([]byte(nil), good.PEM()...), other.RootPEM()...), key: goodKey, wantErr: "2 certificates"},
		{name: "garbage key", cert: good.PEM(), key: []byte("nope"), wantErr: "CA key: no PEM block"},
		{name: "certificate as key", cert: good.PEM(), key: good.PEM(), wantErr: `PEM block "CERTIFICATE"`},
		{name: "wrong key type", cert: good.PEM(), key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: xDER}), wantErr: "unsupported key type"},
		{name: "key of another CA", cert: good.PEM(), key: other.KeyPEM(), wantErr: "does not match"},
		{name: "not a CA", cert: makeCA(t, ecKey, func(c *x509.Certificate) { c.IsCA = false }).PEM(), key: goodKey, wantErr: "not a CA certificate"},
		{name: "no certSign usage", cert: makeCA(t, ecKey, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }).PEM(), key: goodKey, wantErr: "key usage"},
		{name: "expired", cert: makeCA(t, ecKey, func(c *x509.Certificate) { c.NotAfter = time.Now().Add(-time.Minute) }).PEM(), key: goodKey, wantErr: "expired"},
		{name: "no trust domain", cert: makeCA(t, ecKey, func(c *x509.Certificate) { c.Subject.Organization = nil }).PEM(), key: goodKey, wantErr: "names no trust domain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca, err := caclient.LoadBuiltinCA(tc.cert, tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(ca.TrustDomains(), ","); got != tc.wantTDs {
				t.Fatalf("trust domains %q, want %q", got, tc.wantTDs)
			}
			td := ca.TrustDomains()[0]
			if _, err := caclient.New(caclient.Config{Signer: ca}).Fetch(context.Background(), identity.New(td, "ns", "sa")); err != nil {
				t.Fatalf("loaded CA cannot issue: %v", err)
			}
		})
	}
}

func TestNewBuiltinCA(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	if got := ca.TrustDomains(); len(got) != 1 || got[0] != identity.DefaultTrustDomain {
		t.Fatalf("default trust domain %v", got)
	}
	block, _ := pem.Decode(ca.RootPEM())
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := root.PublicKey.(*ecdsa.PublicKey); !ok || !root.IsCA {
		t.Fatalf("root key %T, IsCA %v", root.PublicKey, root.IsCA)
	}
	if life := time.Until(root.NotAfter); life < 9*365*24*time.Hour {
		t.Fatalf("root valid for %v, want 10 years", life)
	}
	if _, err := caclient.NewBuiltinCA("Not/A/Domain"); err == nil {
		t.Fatal("invalid trust domain accepted")
	}
}

// FuzzSign feeds arbitrary bytes as a CSR. Sign must never panic, and what
// it signs must be a single SPIFFE identity in the CA's trust domain.
func FuzzSign(f *testing.F) {
	ca := tlstest.NewCA(f, "cluster.local")
	_, good := csrFor(nil, []string{id.String()}, nil)
	_, two := csrFor(nil, []string{id.String(), "spiffe://cluster.local/ns/a/sa/b"}, nil)
	fuzzseed.Add(f, good)
	fuzzseed.Add(f, two)
	fuzzseed.Add(f, []byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"))
	fuzzseed.Add(f, []byte{})
	f.Fuzz(func(t *testing.T, csr []byte) {
		chain, err := ca.Sign(context.Background(), csr, time.Hour, identity.Identity{})
		if err != nil {
			return
		}
		block, _ := pem.Decode([]byte(chain[0]))
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("signed an unparsable leaf: %v", err)
		}
		if len(leaf.URIs) != 1 {
			t.Fatalf("signed %d URIs", len(leaf.URIs))
		}
		got, err := identity.Parse(leaf.URIs[0].String())
		if err != nil || got.TrustDomain != "cluster.local" {
			t.Fatalf("signed %v (%v) outside the trust domain", leaf.URIs[0], err)
		}
	})
}
