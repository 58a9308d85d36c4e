package tlstest_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestChainVerifies(t *testing.T) {
	root := tlstest.NewRoot(t, tlstest.CAOptions{TrustDomains: []string{"cluster.local"}})
	inter := root.Intermediate(t, tlstest.CAOptions{})
	leaf := inter.Leaf(t, tlstest.LeafOptions{
		URIs:  []string{"spiffe://cluster.local/ns/a/sa/b"},
		Names: []string{"svc.example", "10.0.0.1"},
	})
	if len(leaf.Cert.DNSNames) != 1 || len(leaf.Cert.IPAddresses) != 1 || !leaf.Cert.IPAddresses[0].Equal(net.ParseIP("10.0.0.1")) {
		t.Fatalf("SANs DNS %v IP %v", leaf.Cert.DNSNames, leaf.Cert.IPAddresses)
	}
	inters := x509.NewCertPool()
	inters.AddCert(inter.Cert)
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: leaf.Pool(), Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatal(err)
	}
	if got := len(leaf.TLS().Certificate); got != 2 {
		t.Fatalf("TLS chain has %d certificates, want leaf and intermediate", got)
	}
	if got := len(leaf.ChainPEM()); got != 3 {
		t.Fatalf("PEM chain has %d entries, want leaf, intermediate, root", got)
	}
	wc := leaf.Workload(t, identity.New("", "a", "b"))
	if wc.Certificate.Leaf.SerialNumber.Cmp(leaf.Serial()) != 0 {
		t.Fatal("workload certificate is not the leaf")
	}
}

func TestValidityAndBuiltin(t *testing.T) {
	root := tlstest.NewRoot(t, tlstest.CAOptions{TrustDomains: []string{"a.example", "b.example"}})
	expired := root.Leaf(t, tlstest.LeafOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if _, err := expired.Cert.Verify(x509.VerifyOptions{Roots: root.Pool()}); err == nil {
		t.Fatal("expired leaf verified")
	}
	b := root.Builtin(t)
	for _, td := range []string{"a.example", "b.example"} {
		c := tlstest.Cert(t, b, identity.New(td, "ns", "sa"))
		if _, err := c.Certificate.Leaf.Verify(x509.VerifyOptions{Roots: root.Pool()}); err != nil {
			t.Fatalf("%s: %v", td, err)
		}
	}
	back := tlstest.FromBuiltin(t, b)
	if !back.Cert.Equal(root.Cert) {
		t.Fatal("FromBuiltin returned another root")
	}
}

func TestCRLRevokes(t *testing.T) {
	root := tlstest.NewRoot(t, tlstest.CAOptions{})
	leaf := root.Leaf(t, tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns/a/sa/b"}})
	crl, err := x509.ParseRevocationList(root.CRL(t, leaf.Serial()))
	if err != nil {
		t.Fatal(err)
	}
	if err := crl.CheckSignatureFrom(root.Cert); err != nil {
		t.Fatal(err)
	}
	if len(crl.RevokedCertificateEntries) != 1 || crl.RevokedCertificateEntries[0].SerialNumber.Cmp(leaf.Serial()) != 0 {
		t.Fatalf("CRL revokes %v", crl.RevokedCertificateEntries)
	}
	if _, err := mtls.ParseCRLs(tlstest.CRLPEM(root.CRL(t))); err != nil {
		t.Fatal(err)
	}
}

func TestSelfSignedTLS(t *testing.T) {
	srv, cli := tlstest.SelfSignedTLS(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	errc := make(chan error, 1)
	go func() { errc <- tls.Server(a, srv).Handshake() }()
	c := tls.Client(b, cli)
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN %q", p)
	}
}

func TestNewSelfSignedReturnsErrors(t *testing.T) {
	if _, err := tlstest.NewSelfSigned(tlstest.LeafOptions{URIs: []string{"spiffe://%zz"}}); err == nil {
		t.Fatal("a URI SAN that does not parse made a certificate")
	}
	l, err := tlstest.NewSelfSigned(tlstest.LeafOptions{Names: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Cert.Verify(x509.VerifyOptions{Roots: l.Pool(), DNSName: "localhost"}); err != nil {
		t.Fatalf("self-signed leaf does not verify against its own pool: %v", err)
	}
}
