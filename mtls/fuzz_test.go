package mtls_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// FuzzPeerIdentity reads the peer identity from a leaf certificate as the
// inbound path does: der is the certificate (a peer chooses every byte of
// it), and uris adds URI SANs, one per line, after the certificate's own.
// The identity returned is the first URI SAN that is a SPIFFE identity, and
// it prints back to that URI; with none, the error is ErrNoIdentity.
func FuzzPeerIdentity(f *testing.F) {
	root := tlstest.NewRoot(f, tlstest.CAOptions{})
	key := tlstest.NewKey(f)
	for _, o := range []tlstest.LeafOptions{
		{URIs: []string{"spiffe://cluster.local/ns/default/sa/web"}},
		{URIs: []string{"https://example.com/x", "spiffe://td/ns/a/sa/b", "spiffe://td/ns/c/sa/d"}},
		{Names: []string{"web.default.svc"}},
	} {
		o.Key = key
		fuzzseed.Add(f, root.Leaf(f, o).Cert.Raw, "")
	}
	fuzzseed.Add(f, []byte{}, "spiffe://cluster.local/ns/a/sa/b")
	fuzzseed.Add(f, []byte{0x30}, "spiffe://td/ns/a/sa\nspiffe://td/ns/a/sa/b/c\nspiffe://td/ns/a/sa/b")
	f.Fuzz(func(t *testing.T, der []byte, uris string) {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			c = &x509.Certificate{}
		}
		if uris != "" {
			for line := range strings.SplitSeq(uris, "\n") {
				if u, err := url.Parse(line); err == nil {
					c.URIs = append(c.URIs, u)
				}
			}
		}
		id, err := mtls.PeerIdentity(tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{c}})
		var first *url.URL
		for _, u := range c.URIs {
			if _, perr := identity.Parse(u.String()); perr == nil {
				first = u
				break
			}
		}
		switch {
		case first == nil:
			if !errors.Is(err, mtls.ErrNoIdentity) {
				t.Fatalf("no SPIFFE URI in %v, yet identity %v (%v)", c.URIs, id, err)
			}
		case err != nil:
			t.Fatalf("SPIFFE URI %v not read: %v", first, err)
		case id.String() != first.String():
			t.Fatalf("identity %v, first SPIFFE URI %v", id, first)
		}
	})
}
