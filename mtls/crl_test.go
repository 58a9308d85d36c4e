package mtls_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// newCRLRoot returns a self-signed root for cluster.local allowed to sign
// CRLs.
func newCRLRoot(t testing.TB, cn string) *tlstest.CA {
	t.Helper()
	return tlstest.NewRoot(t, tlstest.CAOptions{CommonName: cn, Organization: []string{"cluster.local"}, TrustDomains: []string{"cluster.local"}})
}

// workload issues a workload certificate for uri (a cluster.local SPIFFE
// ID) from ca, whose chain ends at its root.
func workload(t testing.TB, ca *tlstest.CA, uri string) *mtls.WorkloadCert {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(uri, "spiffe://cluster.local/"), "/")
	return ca.Leaf(t, tlstest.LeafOptions{URIs: []string{uri}}).Workload(t, identity.New("", parts[1], parts[3]))
}

func leafSerial(c *mtls.WorkloadCert) *big.Int { return c.Certificate.Leaf.SerialNumber }

func TestParseCRLs(t *testing.T) {
	root := newCRLRoot(t, "root")
	a, b := root.CRL(t, big.NewInt(7)), root.CRL(t)
	certBlock := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})
	for _, tc := range []struct {
		name string
		data []byte
		want int
		bad  bool
	}{
		{"empty", nil, 0, false},
		{"whitespace", []byte(" \n\t\n"), 0, false},
		{"der", a, 1, false},
		{"pem one", tlstest.CRLPEM(a), 1, false},
		{"pem two, certificate skipped", append(append(tlstest.CRLPEM(a), certBlock...), tlstest.CRLPEM(b)...), 2, false},
		{"pem without crl", certBlock, 0, false},
		{"garbage", []byte("not a valid CRL"), 0, true},
		{"truncated der", a[:len(a)/2], 0, true},
		{"pem with bad body", pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte{0x30, 0x03, 1, 2, 3}}), 0, true},
		{"pem then garbage", append(tlstest.CRLPEM(a), []byte("-----BEGIN X509 CRL-----\nnope")...), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mtls.ParseCRLs(tc.data)
			if tc.bad {
				if !errors.Is(err, mtls.ErrBadCRL) {
					t.Fatalf("err = %v, want ErrBadCRL", err)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("got %d CRLs, %v; want %d", len(got), err, tc.want)
			}
		})
	}
}

func TestCRLSetRevoked(t *testing.T) {
	root := newCRLRoot(t, "root")
	inter := root.Intermediate(t, tlstest.CAOptions{CommonName: "intermediate"})
	// forged claims the intermediate's name with another key.
	forged := root.Intermediate(t, tlstest.CAOptions{CommonName: "intermediate"})
	other := newCRLRoot(t, "root") // same name as root, another key

	direct := workload(t, root, "spiffe://cluster.local/ns/a/sa/direct")
	viaInter := workload(t, inter, "spiffe://cluster.local/ns/a/sa/inter")
	chainOf := func(c *mtls.WorkloadCert) []*x509.Certificate {
		var out []*x509.Certificate
		for _, d := range c.Certificate.Certificate {
			x, err := x509.ParseCertificate(d)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, x)
		}
		return append(out, root.Cert)
	}
	anchors := []*x509.Certificate{root.Cert}
	for _, tc := range []struct {
		name       string
		crls       [][]byte
		anchors    []*x509.Certificate
		chain      []*x509.Certificate
		lookup     []*x509.Certificate // anchors given to Revoked
		revoked    bool
		loadFails  bool
		unanchored int
	}{
		{name: "root revokes leaf", crls: [][]byte{root.CRL(t, leafSerial(direct))}, anchors: anchors, chain: chainOf(direct), revoked: true},
		{name: "root lists another serial", crls: [][]byte{root.CRL(t, big.NewInt(999999))}, anchors: anchors, chain: chainOf(direct)},
		{name: "presented chain without root finds it among anchors", crls: [][]byte{root.CRL(t, leafSerial(direct))}, anchors: anchors, chain: chainOf(direct)[:1], lookup: anchors, revoked: true},
		{name: "presented chain, root unknown, anchored at load", crls: [][]byte{root.CRL(t, leafSerial(direct))}, anchors: anchors, chain: chainOf(direct)[:1], revoked: true},
		{name: "stray certificate under the root's name in a presented chain", crls: [][]byte{root.CRL(t, leafSerial(direct))}, anchors: anchors, chain: []*x509.Certificate{chainOf(direct)[0], other.Cert}, lookup: anchors, revoked: true},
		{name: "intermediate revokes leaf", crls: [][]byte{inter.CRL(t, leafSerial(viaInter))}, anchors: anchors, chain: chainOf(viaInter), revoked: true, unanchored: 1},
		{name: "intermediate known at load", crls: [][]byte{inter.CRL(t, leafSerial(viaInter))}, anchors: []*x509.Certificate{root.Cert, inter.Cert}, chain: chainOf(viaInter)[:2], revoked: true},
		{name: "root revokes the intermediate", crls: [][]byte{root.CRL(t, inter.Cert.SerialNumber)}, anchors: anchors, chain: chainOf(viaInter), revoked: true},
		{name: "root's CRL does not apply to the intermediate's leaves", crls: [][]byte{root.CRL(t, leafSerial(viaInter))}, anchors: anchors, chain: chainOf(viaInter)},
		{name: "forged intermediate CRL is not applied", crls: [][]byte{forged.CRL(t, leafSerial(viaInter))}, anchors: anchors, chain: chainOf(viaInter), unanchored: 1},
		{name: "CRL signed by another key under the root's name fails to load", crls: [][]byte{other.CRL(t, leafSerial(direct))}, anchors: anchors, loadFails: true},
		{name: "no CRLs", anchors: anchors, chain: chainOf(direct)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var crls []*x509.RevocationList
			for _, d := range tc.crls {
				c, err := x509.ParseRevocationList(d)
				if err != nil {
					t.Fatal(err)
				}
				crls = append(crls, c)
			}
			set, err := mtls.NewCRLSet(crls, tc.anchors)
			if tc.loadFails {
				if !errors.Is(err, mtls.ErrBadCRL) {
					t.Fatalf("NewCRLSet: %v, want ErrBadCRL", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := set.Unanchored(); got != tc.unanchored {
				t.Errorf("Unanchored = %d, want %d", got, tc.unanchored)
			}
			// Twice: the second answer comes from the signature cache.
			for range 2 {
				if _, got := set.Revoked(tc.chain, tc.lookup); got != tc.revoked {
					t.Fatalf("Revoked = %v, want %v", got, tc.revoked)
				}
			}
		})
	}
}

// crlFile writes data to a CRL file in a new directory.
func crlFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca-crl.pem")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newTestCRL(t *testing.T, path string, anchors ...*x509.Certificate) *mtls.CRL {
	t.Helper()
	c, err := mtls.NewCRL(mtls.CRLConfig{Path: path, Anchors: func() []*x509.Certificate { return anchors }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHandshakeRevoked(t *testing.T) {
	root := newCRLRoot(t, "root")
	inter := root.Intermediate(t, tlstest.CAOptions{CommonName: "intermediate"})
	srv := workload(t, root, "spiffe://cluster.local/ns/a/sa/server")
	cli := workload(t, root, "spiffe://cluster.local/ns/a/sa/client")
	cliInter := workload(t, inter, "spiffe://cluster.local/ns/a/sa/client")
	sans := []string{"spiffe://cluster.local/ns/a/sa/server"}
	for _, tc := range []struct {
		name               string
		srvCRL, cliCRL     []byte // nil: no CRL on that side
		client             *mtls.WorkloadCert
		srvRefuses, cliRef bool
	}{
		{name: "nothing revoked", srvCRL: tlstest.CRLPEM(root.CRL(t)), cliCRL: tlstest.CRLPEM(root.CRL(t)), client: cli},
		{name: "server refuses revoked client", srvCRL: tlstest.CRLPEM(root.CRL(t, leafSerial(cli))), client: cli, srvRefuses: true},
		{name: "client refuses revoked server", cliCRL: tlstest.CRLPEM(root.CRL(t, leafSerial(srv))), client: cli, cliRef: true},
		{name: "server refuses client revoked by its intermediate", srvCRL: tlstest.CRLPEM(inter.CRL(t, leafSerial(cliInter))), client: cliInter, srvRefuses: true},
		{name: "server refuses client whose intermediate is revoked", srvCRL: tlstest.CRLPEM(root.CRL(t, inter.Cert.SerialNumber)), client: cliInter, srvRefuses: true},
		{name: "intermediate's CRL revokes another serial", srvCRL: tlstest.CRLPEM(inter.CRL(t, leafSerial(cli))), client: cliInter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srvOpts, cliOpts []mtls.Option
			if tc.srvCRL != nil {
				srvOpts = append(srvOpts, mtls.WithCRL(newTestCRL(t, crlFile(t, tc.srvCRL), root.Cert)))
			}
			if tc.cliCRL != nil {
				cliOpts = append(cliOpts, mtls.WithCRL(newTestCRL(t, crlFile(t, tc.cliCRL), root.Cert)))
			}
			r := handshake(t, mtls.ServerConfig(static(srv), srvOpts...), mtls.ClientConfig(tc.client, sans, cliOpts...))
			switch {
			case tc.srvRefuses:
				if !errors.Is(r.srvErr, mtls.ErrRevoked) || r.cliErr == nil {
					t.Fatalf("server %v, client %v; want the server to refuse with ErrRevoked", r.srvErr, r.cliErr)
				}
			case tc.cliRef:
				if !errors.Is(r.cliErr, mtls.ErrRevoked) || r.srvErr == nil {
					t.Fatalf("client %v, server %v; want the client to refuse with ErrRevoked", r.cliErr, r.srvErr)
				}
			default:
				if r.srvErr != nil || r.cliErr != nil {
					t.Fatalf("server %v, client %v; want success", r.srvErr, r.cliErr)
				}
			}
		})
	}

	t.Run("open connection revoked by a reload", func(t *testing.T) {
		path := crlFile(t, nil)
		srvCRL := newTestCRL(t, path, root.Cert)
		cliCRL := newTestCRL(t, path, root.Cert)
		r := handshake(t, mtls.ServerConfig(static(srv), mtls.WithCRL(srvCRL)), mtls.ClientConfig(cli, sans, mtls.WithCRL(cliCRL)))
		if r.srvErr != nil || r.cliErr != nil {
			t.Fatalf("server %v, client %v", r.srvErr, r.cliErr)
		}
		for side, cs := range map[string]tls.ConnectionState{"server": r.srv, "client": r.cli} {
			if _, revoked := srvCRL.RevokedConn(cs); revoked {
				t.Fatalf("%s side: revoked before any CRL", side)
			}
		}
		if err := os.WriteFile(path, tlstest.CRLPEM(root.CRL(t, leafSerial(srv), leafSerial(cli))), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*mtls.CRL{srvCRL, cliCRL} {
			if changed, err := c.Reload(); !changed || err != nil {
				t.Fatalf("Reload = %v, %v", changed, err)
			}
		}
		if c, revoked := srvCRL.RevokedConn(r.srv); !revoked || c.SerialNumber.Cmp(leafSerial(cli)) != 0 {
			t.Errorf("server side: client not found revoked (%v)", revoked)
		}
		// The client side's state has no verified chains: the presented
		// chain and the anchors decide.
		if c, revoked := cliCRL.RevokedConn(r.cli); !revoked || c.SerialNumber.Cmp(leafSerial(srv)) != 0 {
			t.Errorf("client side: server not found revoked (%v)", revoked)
		}
	})
}

func TestCRLReload(t *testing.T) {
	root := newCRLRoot(t, "root")
	other := newCRLRoot(t, "root")
	cli := workload(t, root, "spiffe://cluster.local/ns/a/sa/client")
	chains := [][]*x509.Certificate{{cli.Certificate.Leaf, root.Cert}}
	good := tlstest.CRLPEM(root.CRL(t, leafSerial(cli)))

	dir := t.TempDir()
	path := filepath.Join(dir, "ca-crl.pem")
	var mu sync.Mutex
	var errs []error
	c, err := mtls.NewCRL(mtls.CRLConfig{
		Path: path, Anchors: func() []*x509.Certificate { return []*x509.Certificate{root.Cert} },
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	})
	if err != nil {
		t.Fatalf("a missing file must not fail NewCRL: %v", err)
	}
	if c.Set() != nil || c.Check(chains) != nil {
		t.Fatal("a missing file revokes something")
	}
	var sets []*mtls.CRLSet
	stop := c.Subscribe(func(s *mtls.CRLSet) { sets = append(sets, s) })
	defer stop()

	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name    string
		data    []byte // nil: remove the file
		changed bool
		bad     bool
	}{
		{"good CRL", good, true, false},
		{"same content again", good, false, false},
		{"garbage keeps the last good set", []byte("not a valid CRL"), false, true},
		{"wrongly signed keeps the last good set", tlstest.CRLPEM(other.CRL(t)), false, true},
		{"file removed keeps the last good set", nil, false, true},
		{"good again", good, false, false}, // same content as the set in force
		{"empty file revokes nothing", []byte{}, true, false},
	}
	for i, st := range steps {
		if st.data == nil {
			os.Remove(path)
		} else {
			write(st.data)
		}
		changed, err := c.Reload()
		if changed != st.changed || (err != nil) != st.bad {
			t.Fatalf("step %d (%s): Reload = %v, %v", i, st.name, changed, err)
		}
		if st.bad && !errors.Is(err, mtls.ErrBadCRL) && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("step %d (%s): %v", i, st.name, err)
		}
		wantRevoked := i < len(steps)-1
		if got := errors.Is(c.Check(chains), mtls.ErrRevoked); got != wantRevoked {
			t.Fatalf("step %d (%s): revoked = %v, want %v", i, st.name, got, wantRevoked)
		}
	}
	if len(sets) != 2 {
		t.Errorf("subscriber saw %d sets, want 2", len(sets))
	}
	if len(errs) != 3 || c.Failures() != 3 {
		t.Errorf("OnError got %d errors, Failures %d; want 3", len(errs), c.Failures())
	}
	stop()
	write(good)
	if changed, _ := c.Reload(); !changed || len(sets) != 2 {
		t.Errorf("after cancel: changed %v, subscriber saw %d sets", changed, len(sets))
	}
}

// TestCRLRunSymlinkSwap updates the file as Kubernetes updates a ConfigMap
// volume: the path is a symlink through "..data" to a versioned directory,
// and an update swaps "..data" atomically.
func TestCRLRunSymlinkSwap(t *testing.T) {
	root := newCRLRoot(t, "root")
	cli := workload(t, root, "spiffe://cluster.local/ns/a/sa/client")
	chains := [][]*x509.Certificate{{cli.Certificate.Leaf, root.Cert}}
	dir := t.TempDir()
	version := func(name string, data []byte) {
		t.Helper()
		vd := filepath.Join(dir, name)
		if err := os.Mkdir(vd, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(vd, "ca-crl.pem"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", tlstest.CRLPEM(root.CRL(t)))
	if err := os.Symlink("..data/ca-crl.pem", filepath.Join(dir, "ca-crl.pem")); err != nil {
		t.Fatal(err)
	}
	c, err := mtls.NewCRL(mtls.CRLConfig{
		Path: filepath.Join(dir, "ca-crl.pem"), PollInterval: 10 * time.Millisecond,
		Anchors: func() []*x509.Certificate { return []*x509.Certificate{root.Cert} },
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Check(chains) != nil {
		t.Fatal("revoked by the first version")
	}
	loaded := make(chan *mtls.CRLSet, 1)
	defer c.Subscribe(func(s *mtls.CRLSet) { loaded <- s })()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	version("..v2", tlstest.CRLPEM(root.CRL(t, leafSerial(cli))))
	select {
	case <-loaded:
	case <-time.After(30 * time.Second):
		t.Fatal("the symlink swap was not picked up")
	}
	if !errors.Is(c.Check(chains), mtls.ErrRevoked) {
		t.Fatal("the second version is not in force")
	}
}

// TestCRLIssuerRefusalSaysWhy: a CRL refused at load names the reason an
// operator can act on. A root whose key usage lacks cRLSign (its CRL signed
// with the same key through a twin certificate that has it) is not "not
// signed"; a CRL signed by another key of the same name is.
func TestCRLIssuerRefusalSaysWhy(t *testing.T) {
	twin := newCRLRoot(t, "mesh root")
	noCRLSign := tlstest.NewRoot(t, tlstest.CAOptions{CommonName: "mesh root", Organization: []string{"cluster.local"},
		KeyUsage: x509.KeyUsageCertSign, Key: twin.Key})
	notCA := tlstest.NewRoot(t, tlstest.CAOptions{CommonName: "mesh root", Organization: []string{"cluster.local"}, Key: twin.Key,
		Modify: func(c *x509.Certificate) { c.IsCA = false; c.KeyUsage = x509.KeyUsageDigitalSignature }})
	otherKey := newCRLRoot(t, "mesh root")
	crl, err := x509.ParseRevocationList(twin.CRL(t, big.NewInt(9)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		anchor *tlstest.CA
		want   string
	}{
		{"issuer without cRLSign", noCRLSign, "lacks the cRLSign key usage"},
		{"issuer that is not a CA", notCA, "is not a CA certificate"},
		{"another key of the same name", otherKey, "not signed by the CA certificate of that name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mtls.NewCRLSet([]*x509.RevocationList{crl}, []*x509.Certificate{tc.anchor.Cert})
			if !errors.Is(err, mtls.ErrBadCRL) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewCRLSet: %v, want ErrBadCRL saying %q", err, tc.want)
			}
		})
	}
	if _, err := mtls.NewCRLSet([]*x509.RevocationList{crl}, []*x509.Certificate{twin.Cert}); err != nil {
		t.Fatalf("the twin that may sign CRLs: %v", err)
	}
}
