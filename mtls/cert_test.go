package mtls_test

import (
	"crypto"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestParseChain(t *testing.T) {
	id := identity.New("", "ns", "sa")
	uris := []string{id.String()}
	root1 := tlstest.NewRoot(t, tlstest.CAOptions{})
	root2 := tlstest.NewRoot(t, tlstest.CAOptions{})
	inter := root2.Intermediate(t, tlstest.CAOptions{})
	key := tlstest.NewKey(t)
	otherKey := tlstest.NewKey(t)

	leaf1 := string(root1.Leaf(t, tlstest.LeafOptions{Key: key, URIs: uris}).PEM())
	leaf2 := string(root2.Leaf(t, tlstest.LeafOptions{Key: key, URIs: uris}).PEM())
	leafInter := string(inter.Leaf(t, tlstest.LeafOptions{Key: key, URIs: uris}).PEM())
	twoURIs := string(root1.Leaf(t, tlstest.LeafOptions{Key: key, URIs: []string{"spiffe://cluster.local/ns/ns/sa/other", id.String()}}).PEM())
	noURI := string(root1.Leaf(t, tlstest.LeafOptions{Key: key, Names: []string{"a.example"}}).PEM())
	expired := string(root1.Leaf(t, tlstest.LeafOptions{Key: key, URIs: uris, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}).PEM())
	root1PEM, root2PEM, interPEM := string(root1.PEM()), string(root2.PEM()), string(inter.PEM())
	bothRoots := root1PEM + "\n" + root2PEM

	tests := []struct {
		name      string
		chain     []string
		key       crypto.Signer
		want      identity.Identity // zero: id
		zeroWant  bool              // ask for the zero identity
		wantInter int               // intermediates in the parsed chain
		wantErr   string            // substring; "" means success
		wantIs    error
	}{
		{name: "leaf and root", chain: []string{leaf1, root1PEM}},
		{name: "two concatenated roots, leaf under the second", chain: []string{leaf2, bothRoots}},
		{name: "two concatenated roots, leaf under the first", chain: []string{leaf1, bothRoots}},
		{name: "intermediate entry", chain: []string{leafInter, interPEM, bothRoots}, wantInter: 1},
		{name: "intermediate inside the leaf entry", chain: []string{leafInter + interPEM, root2PEM}, wantInter: 1},
		{name: "text around PEM blocks", chain: []string{"subject=leaf\n" + leaf1 + "\n", "# roots\n" + root1PEM}},
		{name: "identity mismatch", chain: []string{leaf1, root1PEM}, want: identity.New("", "ns", "other"), wantIs: mtls.ErrIdentityMismatch},
		{name: "identity is the second URI", chain: []string{twoURIs, root1PEM}, wantIs: mtls.ErrIdentityMismatch},
		{name: "no URI SAN", chain: []string{noURI, root1PEM}, wantIs: mtls.ErrIdentityMismatch},
		{name: "key mismatch", chain: []string{leaf1, root1PEM}, key: otherKey, wantErr: "private key does not match"},
		{name: "garbage leaf", chain: []string{"not a certificate", root1PEM}, wantErr: "no pem certificate"},
		{name: "garbage root", chain: []string{leaf1, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, wantErr: "root bundle"},
		{name: "garbage intermediate", chain: []string{leafInter, "junk", root2PEM}, wantErr: "intermediate entry 1"},
		{name: "key block in chain", chain: []string{leaf1, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, wantErr: "not a CERTIFICATE"},
		{name: "leaf only", chain: []string{leaf1}, wantErr: "want a leaf and a root bundle"},
		{name: "empty", wantErr: "want a leaf and a root bundle"},
		{name: "wrong root", chain: []string{leaf2, root1PEM}, wantErr: "does not verify"},
		{name: "missing intermediate", chain: []string{leafInter, root2PEM}, wantErr: "does not verify"},
		{name: "expired leaf", chain: []string{expired, root1PEM}, wantErr: "does not verify"},
		{name: "zero identity", chain: []string{leaf1, root1PEM}, zeroWant: true, wantErr: "no identity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.key
			if k == nil {
				k = key
			}
			want := tc.want
			if want.IsZero() && !tc.zeroWant {
				want = id
			}
			c, err := mtls.ParseChain(tc.chain, k, want)
			switch {
			case tc.wantIs != nil:
				if !errors.Is(err, tc.wantIs) {
					t.Fatalf("error %v, want %v", err, tc.wantIs)
				}
				return
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			leaf := c.Certificate.Leaf
			if c.Identity != id || leaf == nil || c.Certificate.PrivateKey != k {
				t.Fatalf("got identity %v, leaf %v, key %v", c.Identity, leaf != nil, c.Certificate.PrivateKey)
			}
			if got := len(c.Certificate.Certificate) - 1; got != tc.wantInter {
				t.Fatalf("%d intermediates, want %d", got, tc.wantInter)
			}
			if string(c.RootsPEM) != tc.chain[len(tc.chain)-1] || len(c.ChainPEM) != len(tc.chain)-1 || c.ChainPEM[0] != tc.chain[0] {
				t.Fatal("ChainPEM/RootsPEM are not the response as received")
			}
			if !c.NotBefore.Equal(leaf.NotBefore) || !c.NotAfter.Equal(leaf.NotAfter) {
				t.Fatal("validity is not the leaf's")
			}
			if c.SerialNumber() != leaf.SerialNumber.String() {
				t.Fatalf("serial %q, want %q", c.SerialNumber(), leaf.SerialNumber)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.Roots, Intermediates: intermediates(t, c)}); err != nil {
				t.Fatalf("leaf does not verify against Roots: %v", err)
			}
		})
	}
}

func intermediates(t *testing.T, c *mtls.WorkloadCert) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	for _, der := range c.Certificate.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		p.AddCert(ic)
	}
	return p
}

func TestRefreshAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &mtls.WorkloadCert{NotBefore: nb, NotAfter: nb.Add(24 * time.Hour)}
	if got, want := c.RefreshAt(), nb.Add(12*time.Hour); !got.Equal(want) {
		t.Fatalf("RefreshAt %v, want %v", got, want)
	}
	if c.SerialNumber() != "" {
		t.Fatal("serial of a certificate without a leaf should be empty")
	}
}

// FuzzParseChain feeds arbitrary PEM-ish bytes as the leaf, middle and root
// entries; ParseChain must never panic, and anything it accepts must be a
// certificate for the requested identity under the given key.
func FuzzParseChain(f *testing.F) {
	id := identity.New("", "ns", "sa")
	root := tlstest.NewRoot(f, tlstest.CAOptions{})
	inter := root.Intermediate(f, tlstest.CAOptions{})
	key := tlstest.NewKey(f)
	leaf := string(root.Leaf(f, tlstest.LeafOptions{Key: key, URIs: []string{id.String()}}).PEM())
	leafInter := string(inter.Leaf(f, tlstest.LeafOptions{Key: key, URIs: []string{id.String()}}).PEM())
	fuzzseed.Add(f, []byte(leaf), []byte(nil), root.PEM(), uint8(2))
	fuzzseed.Add(f, []byte(leafInter), inter.PEM(), root.PEM(), uint8(3))
	fuzzseed.Add(f, []byte(leaf), []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), append(root.PEM(), root.PEM()...), uint8(3))
	fuzzseed.Add(f, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"), []byte{}, []byte{0xff}, uint8(1))
	f.Fuzz(func(t *testing.T, a, b, c []byte, n uint8) {
		var chain []string
		switch n % 4 {
		case 1:
			chain = []string{string(a)}
		case 2:
			chain = []string{string(a), string(c)}
		case 3:
			chain = []string{string(a), string(b), string(c)}
		}
		wc, err := mtls.ParseChain(chain, key, id)
		if err != nil {
			return
		}
		if wc.Identity != id || wc.Certificate.Leaf == nil || !key.PublicKey.Equal(wc.Certificate.Leaf.PublicKey) {
			t.Fatalf("accepted a chain that is not for %v under our key", id)
		}
	})
}
