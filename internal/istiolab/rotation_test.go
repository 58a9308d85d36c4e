//go:build istiolab

package istiolab

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// dumpCertFor returns the leaf of id's certificate in a /config_dump, checked to
// chain to root; nil if there is none.
func dumpCertFor(certs []dumpCert, id string, root []byte) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(root)
	for _, c := range certs {
		if c.Identity != id || len(c.CertChain) == 0 {
			continue
		}
		leaf, err := parseDumpCert(c.CertChain[0].PEM)
		if err != nil {
			return nil, err
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("certificate of %s does not chain to istiod's root: %w", id, err)
		}
		return leaf, nil
	}
	return nil, nil
}

// istiodBackdate is how far before the signing istiod dates a workload
// certificate's NotBefore (ClockSkewGracePeriod in its pki/util): the
// certificate is valid for the requested TTL plus this.
const istiodBackdate = 2 * time.Minute

// rotationTTL is the daemons' SECRET_TTL in TestCertRotation and
// TestRootRotation. The daemon, as ztunnel, renews at half the validity,
// NotBefore + (TTL+2m)/2, which with istiod's backdating is TTL/2 - 1m after
// issuance: 150 s renews 15 s after each issuance (a TTL of 2 min or less
// would be due for renewal as soon as issued).
const rotationTTL = 150 * time.Second

// TestCertRotation runs the daemons with short-lived workload certificates
// (SECRET_TTL, which they ask istiod's CA for in each CSR, as ztunnel does):
// istiod signs them for that lifetime, each daemon renews its pods'
// certificates before they expire (a new serial and a later NotAfter in
// /config_dump's certificates, under the same root), and calls between the
// pods keep passing across the renewals, through HBONE.
func TestCertRotation(t *testing.T) {
	m := startTrafficMesh(t, "SECRET_TTL="+rotationTTL.String())
	ctx := t.Context()
	root, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	// The server's certificate on node1, the far client's on node2.
	watch := []struct {
		z  *Ztunnel
		id string
	}{
		{m.ztunnels[0], "spiffe://cluster.local/ns/demo/sa/server"},
		{m.ztunnels[1], "spiffe://cluster.local/ns/demo/sa/client"},
	}
	first := make([]*x509.Certificate, len(watch))
	for i, w := range watch {
		waitUntil(t, time.Minute, func() error {
			certs, err := configDumpCerts(ctx, w.z.Pod)
			if err != nil {
				return err
			}
			first[i], err = dumpCertFor(certs, w.id, root)
			if err == nil && first[i] == nil {
				err = fmt.Errorf("%s holds no certificate for %s", w.z.Name, w.id)
			}
			return err
		})
		if got, want := first[i].NotAfter.Sub(first[i].NotBefore), rotationTTL+istiodBackdate; got < want-2*time.Second || got > want+2*time.Second {
			t.Fatalf("%s: istiod signed %s for %v (NotBefore %s, NotAfter %s), want SECRET_TTL + its %v backdating = %v",
				w.z.Name, w.id, got, first[i].NotBefore, first[i].NotAfter, istiodBackdate, want)
		}
	}
	load := startCallLoop(ctx, m.clients, m.dst)
	start := time.Now()
	for i, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			certs, err := configDumpCerts(ctx, w.z.Pod)
			if err != nil {
				return err
			}
			cur, err := dumpCertFor(certs, w.id, root)
			if err != nil {
				return err
			}
			if cur == nil || cur.SerialNumber.Cmp(first[i].SerialNumber) == 0 {
				return fmt.Errorf("%s has not renewed %s (serial %s, NotAfter %s)", w.z.Name, w.id, first[i].SerialNumber, first[i].NotAfter)
			}
			if !cur.NotAfter.After(first[i].NotAfter) {
				return fmt.Errorf("%s renewed %s with NotAfter %s, not after the old one's %s", w.z.Name, w.id, cur.NotAfter, first[i].NotAfter)
			}
			t.Logf("%s renewed %s %v into the load: serial %s -> %s, NotAfter %s -> %s", w.z.Name, w.id,
				time.Since(start).Round(100*time.Millisecond), first[i].SerialNumber, cur.SerialNumber,
				first[i].NotAfter.Format(time.TimeOnly), cur.NotAfter.Format(time.TimeOnly))
			return nil
		})
	}
	// Calls go on through HBONE after the renewals.
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	ok, failed, errs := load.finish()
	t.Logf("certificate renewals under load: %d calls in %v, %d failed %q", ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed across the renewals", failed, ok+failed)
	}
}

// TestRootRotation moves istiod from its self-signed CA to a plugged-in CA
// under a new root, as Istio's plugin-CA task does it without breaking
// traffic, under calls between the mesh's pods (the daemons' certificates
// short-lived, so they renew within seconds): first istiod is restarted
// with a cacerts Secret that still signs with the old root but trusts both
// (the trust bundle reaches the daemons with their renewed certificates,
// and the kubelet updates their mounted root file from the
// istio-ca-root-cert ConfigMap); then the Secret's signing certificate is
// replaced by an intermediate of the new root, which istiod loads by
// itself. Each daemon's pods' certificates end up chaining to the new root
// alone, the daemons reconnect to istiod (restarted) under the new root,
// and no call fails.
func TestRootRotation(t *testing.T) {
	m := startTrafficMesh(t, "SECRET_TTL="+rotationTTL.String())
	ctx := t.Context()
	oldRoot, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	// istiod's self-signed CA, from the Secret it keeps it in.
	secret := func(key string) []byte {
		out, err := m.cp.Kubectl(ctx, "", "get", "secret", "istio-ca-secret", "-n", IstioNamespace, "-o",
			"jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
		if err != nil {
			t.Fatal(err)
		}
		data, err := base64.StdEncoding.DecodeString(string(out))
		if err != nil || len(data) == 0 {
			t.Fatalf("istio-ca-secret's %s: %q (%v)", key, out, err)
		}
		return data
	}
	oldCert, oldKey := secret("ca-cert.pem"), secret("ca-key.pem")
	newRoot, newRootKey := newTestCA(t, "istiolab root 2", nil, nil)
	inter, interKey := newTestCA(t, "istiolab intermediate 2", newRoot, newRootKey)
	bundle := slices.Concat(oldRoot, newRoot.pem)
	watch := []struct {
		z  *Ztunnel
		id string
	}{
		{m.ztunnels[0], "spiffe://cluster.local/ns/demo/sa/server"},
		{m.ztunnels[1], "spiffe://cluster.local/ns/demo/sa/client"},
	}
	load := startCallLoop(ctx, m.clients, m.dst)
	start := time.Now()

	// 1: trust both roots, sign with the old one.
	if err := m.cp.PlugCA(ctx, CACerts{CACert: oldCert, CAKey: oldKey, CertChain: oldCert, RootCert: bundle}); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		root, err := m.cp.RootCert(ctx, IstioNamespace)
		if err != nil {
			return err
		}
		if !bytes.Contains(root, newRoot.pem) {
			return errors.New("istio-ca-root-cert does not hold the new root yet")
		}
		return nil
	})
	// The lab's kubelet syncs each daemon's mounted istio-ca-root-cert.
	for _, z := range m.ztunnels {
		waitUntil(t, 30*time.Second, func() error {
			b, err := os.ReadFile(filepath.Join(m.cp.dir(z.Name), rootFile))
			if err != nil {
				return err
			}
			if !bytes.Contains(b, newRoot.pem) {
				return fmt.Errorf("%s's root file does not hold the new root yet", z.Name)
			}
			return nil
		})
	}
	for _, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			roots, leaf, err := dumpRoots(ctx, w.z.Pod, w.id)
			if err != nil {
				return err
			}
			if len(roots) != 2 {
				return fmt.Errorf("%s: %s's certificate comes with %d roots, want both", w.z.Name, w.id, len(roots))
			}
			if err := chainsTo(leaf, nil, oldRoot); err != nil {
				return fmt.Errorf("%s: %s: %w", w.z.Name, w.id, err)
			}
			return nil
		})
	}
	t.Logf("both roots trusted %v into the load", time.Since(start).Round(100*time.Millisecond))

	// 2: sign with an intermediate of the new root, loaded by istiod from
	// its updated files.
	if err := m.cp.PlugCA(ctx, CACerts{CACert: inter.pem, CAKey: interKey, CertChain: slices.Concat(inter.pem, newRoot.pem), RootCert: bundle}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		log, _ := os.ReadFile(m.cp.LogPath("istiod"))
		if !strings.Contains(string(log), "Istiod has detected the newly added intermediate CA") {
			return errors.New("istiod has not loaded the new intermediate")
		}
		return nil
	})
	for _, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			_, leaf, err := dumpRoots(ctx, w.z.Pod, w.id)
			if err != nil {
				return err
			}
			if err := chainsTo(leaf, inter.pem, newRoot.pem); err != nil {
				return fmt.Errorf("%s: %s: not yet under the new root: %w", w.z.Name, w.id, err)
			}
			return nil
		})
	}
	t.Logf("pods' certificates under the new root %v into the load", time.Since(start).Round(100*time.Millisecond))
	// istiod restarted once more: each daemon's new xDS connection chainsTo
	// istiod's serving certificate, now under the new root, with the root
	// file the kubelet updated (which the daemon re-reads).
	connected := make([]int, len(m.ztunnels))
	for i, z := range m.ztunnels {
		connected[i] = m.xdsConnections(z)
	}
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	for i, z := range m.ztunnels {
		waitUntil(t, time.Minute, func() error {
			if m.xdsConnections(z) <= connected[i] {
				return fmt.Errorf("%s has not reconnected to istiod under the new root: %s", z.Name, lastLineWith(z.Log(), "xds:"))
			}
			return nil
		})
	}
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	ok, failed, errs := load.finish()
	t.Logf("root rotation under load: %d calls in %v, %d failed %q", ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed across the root rotation", failed, ok+failed)
	}
}

// testCACert is a test CA's certificate, parsed and PEM.
type testCACert struct {
	cert *x509.Certificate
	pem  []byte
}

// newTestCA makes a CA certificate for cn, signed by parent (self-signed if
// nil), and its key as PKCS#8 PEM.
func newTestCA(t *testing.T, cn string, parent *testCACert, parentKey []byte) (*testCACert, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{Organization: []string{"cluster.local"}, CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		block, _ := pem.Decode(parentKey)
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		signer, signerKey = parent.cert, k
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &testCACert{cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// dumpRoots returns the roots and the leaf of id's certificate in the
// daemon's /config_dump in pod.
func dumpRoots(ctx context.Context, pod *netnslab.Pod, id string) ([]*x509.Certificate, *x509.Certificate, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: pod.Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15000/config_dump", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var dump struct {
		Certificates []struct {
			Identity  string                 `json:"identity"`
			CertChain []struct{ PEM string } `json:"certChain"`
			RootCerts []struct{ PEM string } `json:"rootCerts"`
		} `json:"certificates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dump); err != nil {
		return nil, nil, fmt.Errorf("config_dump: %w", err)
	}
	for _, c := range dump.Certificates {
		if c.Identity != id || len(c.CertChain) == 0 {
			continue
		}
		leaf, err := parseDumpCert(c.CertChain[0].PEM)
		if err != nil {
			return nil, nil, err
		}
		var roots []*x509.Certificate
		for _, r := range c.RootCerts {
			root, err := parseDumpCert(r.PEM)
			if err != nil {
				return nil, nil, err
			}
			roots = append(roots, root)
		}
		return roots, leaf, nil
	}
	return nil, nil, fmt.Errorf("no certificate for %s in /config_dump", id)
}

// chainsTo checks that leaf chains to root (PEM, the only root trusted)
// through inter (PEM, may be nil).
func chainsTo(leaf *x509.Certificate, inter, root []byte) error {
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AppendCertsFromPEM(root)
	inters.AppendCertsFromPEM(inter)
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
