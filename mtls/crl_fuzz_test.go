package mtls_test

import (
	"crypto/x509"
	"errors"
	"math/big"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// FuzzParseCRLs reads a CRL file as a reload does: data is the file (whoever
// can write the ConfigMap chooses every byte). Parsing never panics, fails
// only with ErrBadCRL, and every CRL it returns indexes into a set that can
// be asked about a chain whose leaf carries each revoked serial.
func FuzzParseCRLs(f *testing.F) {
	root := newCRLRoot(f, "root")
	inter := root.Intermediate(f, tlstest.CAOptions{CommonName: "intermediate"})
	a := root.CRL(f, big.NewInt(7), big.NewInt(1<<40))
	b := inter.CRL(f)
	fuzzseed.Add(f, []byte{})
	fuzzseed.Add(f, a)
	fuzzseed.Add(f, tlstest.CRLPEM(a, b))
	fuzzseed.Add(f, append(root.PEM(), tlstest.CRLPEM(b)...))
	fuzzseed.Add(f, []byte("-----BEGIN X509 CRL-----\nMAA=\n-----END X509 CRL-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		crls, err := mtls.ParseCRLs(data)
		if err != nil {
			if !errors.Is(err, mtls.ErrBadCRL) {
				t.Fatalf("error %v does not wrap ErrBadCRL", err)
			}
			return
		}
		set, err := mtls.NewCRLSet(crls, []*x509.Certificate{root.Cert, inter.Cert})
		if err != nil {
			if !errors.Is(err, mtls.ErrBadCRL) {
				t.Fatalf("NewCRLSet error %v does not wrap ErrBadCRL", err)
			}
			return
		}
		for _, crl := range crls {
			for _, e := range crl.RevokedCertificateEntries {
				leaf := &x509.Certificate{SerialNumber: e.SerialNumber, RawIssuer: crl.RawIssuer, RawSubject: []byte("leaf")}
				set.Revoked([]*x509.Certificate{leaf}, []*x509.Certificate{root.Cert})
			}
		}
	})
}
