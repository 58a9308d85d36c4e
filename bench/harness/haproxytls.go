package harness

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// The HAProxy TLS peers are what an operator would pick for an mTLS tunnel
// without a mesh: OpenSSL, TLS 1.3 only, AES-128-GCM (the suite our
// handshakes agree on with each other), mutual verification against the
// mesh CA, two threads per process (the daemon's GOMAXPROCS on this
// machine kind). In TCP mode HAProxy opens one TLS connection per client
// connection: nothing is pooled, which is what the connection-rate columns
// weigh against our pooled tunnels.
const haproxyTLSSuite = "TLS_AES_128_GCM_SHA256"

// haproxyTLSRole is which half of a TLS path an HAProxy plays.
type haproxyTLSRole int

const (
	// haproxyTerminate accepts mTLS and forwards plain TCP (the server
	// half of the pair, and the one-hop terminator).
	haproxyTerminate haproxyTLSRole = iota
	// haproxyOriginate accepts plain TCP and connects with mTLS (the
	// client half of the pair).
	haproxyOriginate
)

// haproxyTLSConfig is the configuration of one HAProxy TLS half: listen
// and backend addresses, the PEM file with its certificate chain and key,
// the CA file that verifies the peer, and the extra keywords of the bind
// and server lines (the captured pair's PROXY protocol and transparent
// source; empty for the others).
func haproxyTLSConfig(role haproxyTLSRole, listen, backend, crt, ca, bindExtra, serverExtra string) string {
	bind := "bind " + listen
	server := "server s1 " + backend
	tlsArgs := fmt.Sprintf("ssl crt %s ca-file %s verify required", crt, ca)
	if role == haproxyTerminate {
		bind += " " + tlsArgs
	} else {
		// SPIFFE certificates carry a URI SAN only: the chain is verified
		// against the mesh CA, and no host name is asked for (no sni).
		server += " " + tlsArgs
	}
	if bindExtra != "" {
		bind += " " + bindExtra
	}
	if serverExtra != "" {
		server += " " + serverExtra
	}
	return fmt.Sprintf(`global
    maxconn %[4]d
    nbthread 2
    ssl-default-bind-options ssl-min-ver TLSv1.3
    ssl-default-bind-ciphersuites %[1]s
    ssl-default-server-options ssl-min-ver TLSv1.3
    ssl-default-server-ciphersuites %[1]s
defaults
    mode tcp
    timeout connect 5s
    timeout client %[5]s
    timeout server %[5]s
frontend bench
    %[2]s
    default_backend up
backend up
    %[3]s
`, haproxyTLSSuite, bind, server, haproxyMaxConn, haproxyIdleTimeout)
}

// writeHAProxyCert issues a certificate for the SPIFFE identity of sa from
// the mesh CA and writes it as HAProxy wants it: the chain, then the key,
// in one PEM file.
func (b *bench) writeHAProxyCert(ctx context.Context, sa string) (string, error) {
	wc, err := load.LoadCert(ctx, load.CertConfig{CACert: b.caCert, CAKey: b.caKey, Identity: spiffe(sa)})
	if err != nil {
		return "", err
	}
	key, err := x509.MarshalPKCS8PrivateKey(wc.Certificate.PrivateKey)
	if err != nil {
		return "", fmt.Errorf("harness: HAProxy key for %s: %w", sa, err)
	}
	var out strings.Builder
	for _, der := range wc.Certificate.Certificate {
		out.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	out.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}))
	path := filepath.Join(b.dir, "haproxy-"+sa+".pem")
	if err := os.WriteFile(path, []byte(out.String()), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// startHAProxyTLS starts one HAProxy TLS half in pod, listening on
// listen, and waits until it accepts on port.
func (b *bench) startHAProxyTLS(ctx context.Context, pod *netnslab.Pod, name string, role haproxyTLSRole, listen string, port int, backend, crt string) (*proc, error) {
	cfg := haproxyTLSConfig(role, listen, backend, crt, b.caCert, "", "")
	return b.runHAProxy(ctx, pod, name, fmt.Sprintf("haproxy-tls-%d.cfg", port), cfg, port)
}

// skipWithoutHAProxy lists what as skipped and reports true when the run
// has no HAProxy.
func (b *bench) skipWithoutHAProxy(what string) bool {
	if b.o.HAProxy != "" {
		return false
	}
	b.run.Skipped = append(b.run.Skipped, report.Skip{What: what,
		Reason: "haproxy is not installed (apt-get install haproxy; `make bench` does it as root)"})
	return true
}

// addHAProxyTLSTargets adds the one-hop HAProxy mTLS terminator (zload is
// the mTLS client) or, with pair, the two-hop HAProxy mTLS pair (zload is
// a plain client of the client pod's HAProxy). Without HAProxy, or when
// one fails to start, the path is listed as skipped with the reason.
func (b *bench) addHAProxyTLSTargets(ctx context.Context, pair bool) error {
	what := "HAProxy mTLS terminator (one hop)"
	if pair {
		what = "HAProxy mTLS pair (two hops)"
	}
	if b.skipWithoutHAProxy(what) {
		return nil
	}
	skip := func(err error) error {
		b.run.Skipped = append(b.run.Skipped, report.Skip{What: what, Reason: err.Error()})
		return nil
	}
	cli, srv := b.cluster.Pods[podClient], b.cluster.Pods[podServer]
	srvCrt, err := b.writeHAProxyCert(ctx, peerServerSA)
	if err != nil {
		return err
	}
	loopApp := fmt.Sprintf("127.0.0.1:%d", appPort)
	srvAddr := func(port int) string { return netip.AddrPortFrom(srv.IP, uint16(port)).String() }
	if !pair {
		p, err := b.startHAProxyTLS(ctx, srv, "haproxy (mTLS terminator)", haproxyTerminate,
			fmt.Sprintf("0.0.0.0:%d", haproxyTLSPort), haproxyTLSPort, loopApp, srvCrt)
		if err != nil {
			return skip(err)
		}
		b.addTarget(&target{
			cfg: report.Config{ID: report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLS), Group: report.GroupHBONE1,
				Proxy: "HAProxy mTLS terminator (OpenSSL, TLS 1.3, AES-128-GCM, 2 threads)",
				Note:  fmt.Sprintf("zload mTLS client in %s → %s (HAProxy, verify required) → %s", podClient, srvAddr(haproxyTLSPort), loopApp)},
			ns:    cli.NS,
			args:  append([]string{"--tls", "--target", srvAddr(haproxyTLSPort), "--san", spiffe(peerServerSA)}, b.certArgs(zloadSA)...),
			procs: []*proc{p},
		})
		return nil
	}
	cliCrt, err := b.writeHAProxyCert(ctx, peerClientSA)
	if err != nil {
		return err
	}
	hs, err := b.startHAProxyTLS(ctx, srv, "haproxy (mTLS pair, server half)", haproxyTerminate,
		fmt.Sprintf("0.0.0.0:%d", haproxyPairSrv), haproxyPairSrv, loopApp, srvCrt)
	if err != nil {
		return skip(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", haproxyPairCli)
	hc, err := b.startHAProxyTLS(ctx, cli, "haproxy (mTLS pair, client half)", haproxyOriginate,
		listen, haproxyPairCli, srvAddr(haproxyPairSrv), cliCrt)
	if err != nil {
		return skip(err)
	}
	b.addTarget(&target{
		cfg: report.Config{ID: report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair), Group: report.GroupHBONE2,
			Proxy: "HAProxy mTLS pair (OpenSSL, TLS 1.3, AES-128-GCM, 2 threads each)",
			Note: fmt.Sprintf("%s → %s (HAProxy) → mTLS, one TLS connection per connection → %s (HAProxy) → %s",
				podClient, listen, srvAddr(haproxyPairSrv), loopApp)},
		ns: cli.NS, args: []string{"--target", listen}, procs: []*proc{hc, hs},
	})
	return nil
}
