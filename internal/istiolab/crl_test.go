//go:build istiolab

package istiolab

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestCRLThroughIstiod runs the CRL rows (A18, A19) the way an operator
// revokes a certificate in a mesh with a plugged-in CA: the cacerts Secret
// carries ca-crl.pem, istiod loads it with the CA and, when it changes,
// reloads it and writes it into every namespace's istio-ca-crl ConfigMap,
// which the ztunnel chart (peerCaCrl.enabled) mounts for the daemon at
// CRL_PATH. Revoking a client's certificate makes the server's daemon refuse
// that client (A18: istio_crl_policy_rejections_total{reporter=
// "destination"}) while another client of the same identity, whose
// certificate its own daemon asked for, is still served; revoking the
// server's certificate makes the client's daemon refuse the server (A19:
// {reporter="source"}); the CRL emptied again, the calls pass.
//
// One istiod signs every workload with one intermediate here, so the rows'
// revoked intermediate (another cluster's, in Istio's multicluster test) is
// a revoked workload certificate: the same check on the presented chain, one
// level down.
func TestCRLThroughIstiod(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	root, rootKey := newTestCA(t, "Root CA (CRL lab)", nil, nil)
	inter, interKey := newTestCA(t, "Intermediate CA (CRL lab)", root, rootKey)
	var crlNumber int64
	var rootRevokes []*big.Int // what the root's CRL revokes (the intermediate, at the end)
	// crls is ca-crl.pem as Istio's CRL test builds it: the root's CRL and
	// the intermediate's, revoking serials.
	crls := func(serials ...*big.Int) []byte {
		crlNumber++
		out := signCRL(t, root, rootKey, crlNumber, rootRevokes...)
		return append(out, signCRL(t, inter, interKey, crlNumber, serials...)...)
	}
	plug := func(crl []byte) {
		t.Helper()
		err := cp.PlugCA(ctx, CACerts{CACert: inter.pem, CAKey: interKey,
			CertChain: append(bytes.Clone(inter.pem), root.pem...), RootCert: root.pem, CRL: crl})
		if err != nil {
			t.Fatal(err)
		}
	}
	// published waits until istiod wrote crl into istio-system's
	// istio-ca-crl and the daemons' files hold it (each daemon pod the
	// kubelet would sync, names).
	published := func(crl []byte, names ...string) {
		t.Helper()
		waitUntil(t, time.Minute, func() error {
			got, err := cp.CRL(ctx, IstioNamespace)
			if err != nil {
				return err
			}
			if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(crl)) {
				return fmt.Errorf("istiod has not published the new CRL in %s/%s (has %d bytes)", IstioNamespace, crlConfigMap, len(got))
			}
			return nil
		})
		for _, name := range names {
			if err := cp.SyncZtunnelCRL(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The CA plugged in as a Secret before istiod's restart, as Istio's
	// plugin-CA task does; istiod publishes its root and the CRL.
	if err := cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	first := crls()
	plug(first)
	if err := cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		got, err := cp.RootCert(ctx, IstioNamespace)
		if err != nil {
			return err
		}
		if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(root.pem)) {
			return fmt.Errorf("istio-ca-root-cert is not the plugged root yet")
		}
		return nil
	})
	daemons := []string{"ztunnel-node1", "ztunnel-node2"}
	published(first, daemons...) // mounted before the daemons start
	m := startTrafficMeshOn(t, cp, lab, ZtunnelCRLEnv)
	server, far := m.ztunnels[0], m.ztunnels[1]
	for _, z := range m.ztunnels {
		if line := logLineWith(z.Log(), "crl loaded", "crls=2"); line == "" {
			t.Fatalf("%s did not load istiod's CRL at its start; log:\n%s", z.Name, z.Log())
		}
	}
	clientID, serverID := "spiffe://cluster.local/ns/demo/sa/client", "spiffe://cluster.local/ns/demo/sa/server"
	farLeaf := dumpLeaf(t, far.Pod, clientID, inter, root)
	serverLeaf := dumpLeaf(t, server.Pod, serverID, inter, root)
	nearLeaf := dumpLeaf(t, server.Pod, clientID, inter, root)
	t.Logf("certificates from the plugged CA: client on node2 serial %s, client on node1 %s, server %s",
		farLeaf.SerialNumber, nearLeaf.SerialNumber, serverLeaf.SerialNumber)

	revoke := func(serials ...*big.Int) {
		t.Helper()
		reloads := make([]int, len(m.ztunnels))
		for i, z := range m.ztunnels {
			reloads[i] = logLinesWith(z.Log(), "crl reloaded")
		}
		crl := crls(serials...)
		plug(crl)
		published(crl, daemons...)
		for i, z := range m.ztunnels {
			if !nettest.Until(30*time.Second, func() bool { return logLinesWith(z.Log(), "crl reloaded") > reloads[i] }) {
				t.Fatalf("%s did not reload the CRL istiod published", z.Name)
			}
		}
	}

	// A18: the client on node2's certificate revoked; the server's daemon
	// refuses it.
	dest0 := crlRejections(t, server.Pod, "destination")
	revoke(farLeaf.SerialNumber)
	if line := logLineWith(string(mustRead(t, cp.LogPath("istiod"))), "Istiod has detected the newly added CRL file"); line == "" {
		t.Errorf("istiod's log does not show it reloading the CRL")
	}
	refusedCall(t, far.Pod.Name, m.clients[1], m)
	if got := crlRejections(t, server.Pod, "destination"); got <= dest0 {
		t.Errorf("server's daemon: istio_crl_policy_rejections_total{reporter=\"destination\"} %v, was %v", got, dest0)
	} else {
		t.Logf("client-far's certificate revoked: its calls refused; server's daemon {reporter=\"destination\"} %v -> %v", dest0, got)
	}
	// The client beside the server, of the same identity but with its own
	// daemon's certificate, is still served.
	m.waitHBONE(t, server, m.clients[0])

	// A19: the server's certificate revoked too; the client's daemon on
	// node1 refuses the server before any CONNECT.
	src0 := crlRejections(t, server.Pod, "source")
	revoke(farLeaf.SerialNumber, serverLeaf.SerialNumber)
	refusedCall(t, "client-near", m.clients[0], m)
	if got := crlRejections(t, server.Pod, "source"); got <= src0 {
		t.Errorf("node1's daemon: istio_crl_policy_rejections_total{reporter=\"source\"} %v, was %v", got, src0)
	} else {
		t.Logf("server's certificate revoked: client-near's calls refused; node1's daemon {reporter=\"source\"} %v -> %v", src0, got)
	}

	// Nothing revoked any more: both clients are served again.
	revoke()
	for _, c := range m.clients {
		m.waitHBONE(t, server, c)
	}

	// The intermediate itself revoked by the root's CRL (the rows' own
	// case): every certificate istiod signed with it is refused. Which side
	// refuses first depends on the handshake (the client checks the server's
	// chain before it sends its own), so the rejections of both reporters on
	// both daemons are counted.
	total := func() float64 {
		var n float64
		for _, z := range m.ztunnels {
			n += crlRejections(t, z.Pod, "source") + crlRejections(t, z.Pod, "destination")
		}
		return n
	}
	before := total()
	rootRevokes = []*big.Int{inter.cert.SerialNumber}
	revoke()
	for i, c := range m.clients {
		refusedCall(t, c.Name, m.clients[i], m)
	}
	if got := total(); got <= before {
		t.Errorf("after the intermediate's revocation the daemons count %v CRL rejections, as before", got)
	} else {
		t.Logf("intermediate revoked: both clients refused; the daemons' CRL rejections %v -> %v", before, got)
	}
}

// signCRL signs a CRL of ca revoking serials, PEM.
func signCRL(t *testing.T, ca *testCACert, keyPEM []byte, number int64, serials ...*big.Int) []byte {
	t.Helper()
	block, _ := pem.Decode(keyPEM)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatal("CA key is not a signer")
	}
	now := time.Now()
	var entries []x509.RevocationListEntry
	for _, s := range serials {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: now.Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(number), ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(24 * time.Hour),
		RevokedCertificateEntries: entries,
	}, ca.cert, signer)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}

// dumpLeaf returns the leaf of id's certificate in the daemon's
// /config_dump in pod, checked to chain to root through inter alone.
func dumpLeaf(t *testing.T, pod *netnslab.Pod, id string, inter, root *testCACert) *x509.Certificate {
	t.Helper()
	var leaf *x509.Certificate
	waitUntil(t, time.Minute, func() error {
		var err error
		_, leaf, err = dumpRoots(t.Context(), pod, id)
		if err != nil {
			return err
		}
		return chainsTo(leaf, inter.pem, root.pem)
	})
	return leaf
}

// refusedCall waits until a call from c to the server fails (the daemons
// reload the CRL within their poll period).
func refusedCall(t *testing.T, name string, c *netnslab.Pod, m *trafficMesh) {
	t.Helper()
	waitUntil(t, 30*time.Second, func() error {
		if err := call(t.Context(), c, m.dst); err == nil {
			return fmt.Errorf("%s's call still reaches the server", name)
		}
		return nil
	})
}

// crlRejections is istio_crl_policy_rejections_total{reporter} of the
// daemon in pod.
func crlRejections(t *testing.T, pod *netnslab.Pod, reporter string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, samples, err := daemonMetric(ctx, pod, "istio_crl_policy_rejections_total")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, s := range samples {
		if !strings.Contains(s, `reporter="`+reporter+`"`) {
			continue
		}
		f := strings.Fields(s)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
