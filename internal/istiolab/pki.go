package istiolab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// The API server's own PKI: what kubeadm would make on a real cluster, made
// here once per lab. Only the API server's serving certificate and the
// service-account signing key live here; workload certificates come from
// istiod's CA, as in an install.
type apiPKI struct {
	caPEM []byte // the root the kubeconfigs trust
	// frontProxyCAPEM is the root of the API server's request-header
	// authentication (front proxies, such as an aggregated API server's
	// caller): no certificate is issued under it; the API server needs it
	// to publish extension-apiserver-authentication in full, which
	// delegated authentication (kube-controller-manager's port) reads.
	frontProxyCAPEM []byte
	servingPEM      []byte // the API server's certificate (leaf only)
	servingKey      []byte
	saKey           []byte // service-account token signing key (PKCS#8)
	saPub           []byte // its public half, for verification
	adminToken      string // static bearer token of the lab's admin (system:masters)
	// kcmToken is kube-controller-manager's static bearer token, for the
	// user system:kube-controller-manager, whom the API server's bootstrap
	// RBAC policy binds to its roles (what kubeadm gives it as a client
	// certificate).
	kcmToken string
}

// apiServerNames are the names a client may use for the API server: the
// service's names, so a pod that reaches it through the kubernetes Service
// (10.96.0.1 once service VIPs are programmed) verifies it as on a cluster.
var apiServerNames = []string{
	"kubernetes", "kubernetes.default", "kubernetes.default.svc",
	"kubernetes.default.svc.cluster.local", "localhost",
}

// newAPIPKI makes a CA, the API server's serving certificate for ips and
// apiServerNames, a service-account key pair and an admin token.
func newAPIPKI(ips []netip.Addr) (*apiPKI, error) {
	now := time.Now()
	ca, caKey, err := newCA("istiolab kubernetes ca")
	if err != nil {
		return nil, err
	}
	frontProxy, _, err := newCA("istiolab front-proxy ca")
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     apiServerNames,
	}
	for _, ip := range ips {
		srvTmpl.IPAddresses = append(srvTmpl.IPAddresses, ip.AsSlice())
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("istiolab: serving certificate: %w", err)
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	admin, err := randomToken()
	if err != nil {
		return nil, err
	}
	kcm, err := randomToken()
	if err != nil {
		return nil, err
	}
	return &apiPKI{
		caPEM:           pemBlock("CERTIFICATE", ca.Raw),
		frontProxyCAPEM: pemBlock("CERTIFICATE", frontProxy.Raw),
		servingPEM:      pemBlock("CERTIFICATE", srvDER),
		servingKey:      pemBlock("PRIVATE KEY", srvKeyDER),
		saKey:           pemBlock("PRIVATE KEY", saKeyDER),
		saPub:           pemBlock("PUBLIC KEY", saPubDER),
		adminToken:      admin,
		kcmToken:        kcm,
	}, nil
}

// newCA makes a self-signed CA named cn.
func newCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("istiolab: %s: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// randomToken is a static bearer token: 24 random bytes in hex.
func randomToken() (string, error) {
	token := make([]byte, 24)
	if _, err := rand.Read(token); err != nil {
		return "", err
	}
	return hex.EncodeToString(token), nil
}

// write puts the files the API server reads into dir and returns their
// paths by role.
func (p *apiPKI) write(dir string) (map[string]string, error) {
	files := map[string][]byte{
		"ca.crt":             p.caPEM,
		"front-proxy-ca.crt": p.frontProxyCAPEM,
		"apiserver.crt":      p.servingPEM,
		"apiserver.key":      p.servingKey,
		"sa.key":             p.saKey,
		"sa.pub":             p.saPub,
		// token,user,uid,"group": the static token file's format.
		"tokens.csv": fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n%s,%s,%s\n",
			p.adminToken, adminUser, adminUser, p.kcmToken, controllerManagerUser, controllerManagerUser),
	}
	paths := make(map[string]string, len(files))
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
		paths[name] = path
	}
	return paths, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
