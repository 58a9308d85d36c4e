package mtls_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// FuzzPeerIdentity reads the peer identity from a leaf certificate as the
// inbound path does. der is the certificate (a peer chooses every byte of
// it); when it does not parse, der becomes the raw value of a SAN extension,
// so that the walk over GeneralNames meets arbitrary bytes. uris, one URI a
// line, when not empty, is written byte for byte as a SAN extension placed
// before the certificate's own. The identity returned is the first URI SAN
// that identity.Parse accepts as written; with none, the error is
// ErrNoIdentity; whatever it returns, the certificate holds it as written.
func FuzzPeerIdentity(f *testing.F) {
	root := tlstest.NewRoot(f, tlstest.CAOptions{})
	key := tlstest.NewKey(f)
	for _, o := range []tlstest.LeafOptions{
		{URIs: []string{"spiffe://cluster.local/ns/default/sa/web"}},
		{URIs: []string{"https://example.com/x", "spiffe://td/ns/a/sa/b", "spiffe://td/ns/c/sa/d"}},
		{Names: []string{"web.default.svc"}},
		{RawURIs: []string{"SPIFFE://cluster.local/ns/admin/sa/root", "spiffe://cluster.local/ns/a/sa/b"}},
		{URIs: []string{"spiffe://cluster.local/ns//sa/b", "spiffe://cluster.local/ns/a/sa/b"}},
	} {
		o.Key = key
		fuzzseed.Add(f, root.Leaf(f, o).Cert.Raw, "")
	}
	fuzzseed.Add(f, []byte{}, "spiffe://cluster.local/ns/a/sa/b")
	fuzzseed.Add(f, []byte{0x30}, "spiffe://td/ns/a/sa\nspiffe://td/ns/a/sa/b/c\nspiffe://td/ns/a/sa/b")
	fuzzseed.Add(f, []byte{}, "SPIFFE://td/ns/a/sa/b\nspiffe://td/ns//sa/\nspiffe://td/ns/a/sa/b")
	fuzzseed.Add(f, []byte{0x30, 0x03, 0x86, 0x01, 'x'}, "")
	f.Fuzz(func(t *testing.T, der []byte, uris string) {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			c = &x509.Certificate{Extensions: []pkix.Extension{{Id: oidSAN, Value: der}}}
		}
		var want *identity.Identity
		if uris != "" {
			var names []asn1.RawValue
			for line := range strings.SplitSeq(uris, "\n") {
				names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(line)})
				if id, err := identity.Parse(line); err == nil && want == nil {
					want = &id
				}
			}
			value, err := asn1.Marshal(names)
			if err != nil {
				t.Fatal(err)
			}
			der = value // what the identity must be read from
			c.Extensions = append([]pkix.Extension{{Id: oidSAN, Value: value}}, c.Extensions...)
		}
		id, err := mtls.PeerIdentity(tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{c}})
		switch {
		case err != nil && !errors.Is(err, mtls.ErrNoIdentity):
			t.Fatalf("error %v is not ErrNoIdentity", err)
		case uris != "" && want == nil && err == nil:
			t.Fatalf("no SPIFFE URI in %q, yet identity %+v", uris, id)
		case uris != "" && want != nil && (err != nil || id != *want):
			t.Fatalf("identity %+v (%v), want the first SPIFFE URI's %+v", id, err, *want)
		case err == nil && !id.IsZero() && !bytes.Contains(der, []byte(id.String())):
			t.Fatalf("identity %v is not written in the certificate", id)
		}
	})
}

// oidSAN is the subject alternative name extension.
var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}
