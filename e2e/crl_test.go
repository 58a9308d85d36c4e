package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// crlConfig is the mesh of the CRL tests: client on node-a, server on
// node-b, and the pod "outsider" on node-b (no daemon) for peers the test
// makes itself.
const crlConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  services: {}
`

// crlLab is a cluster whose daemons both enforce one CRL file (CRL_PATH),
// which the test rewrites. One file for both is enough to tell the sides
// apart: the server checks only the client's certificate and the client only
// the server's.
type crlLab struct {
	shared     bool                      // one shared-mode daemon per node, else one per pod
	daemons    map[string]*labrun.Daemon // the daemon serving "client" and "server"
	pods       map[string]*netnslab.Pod
	configPath string
	dir        string // the cluster's files (CA, config)
	path       string
	ca         *tlstest.CA // the mesh's root, for CRLs and hand-made leaves
	srv        netip.AddrPort
	// reloads is how many good CRL files reload has written: each daemon
	// logs one "crl reloaded" line per file, so it has put the last in force
	// once it has logged that many.
	reloads int
}

func startCRLLab(t *testing.T, shared bool) *crlLab {
	t.Helper()
	lab := netnslab.New(t)
	dir := t.TempDir()
	l := &crlLab{shared: shared, dir: dir, path: filepath.Join(dir, "crl", "ca-crl.pem")}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
		t.Fatal(err)
	}
	// An empty file revokes nothing (as in ztunnel's tests).
	if err := os.WriteFile(l.path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	extra := map[string][]string{"node-b": {"outsider"}}
	env := []string{"CRL_PATH=" + l.path}
	var ca *caclient.BuiltinCA
	if shared {
		c := startSharedCluster(ctx, t, lab, crlConfig, labrun.SharedOptions{
			Binary: ztunnelBin, Dir: dir, ExtraPods: extra, DaemonEnv: env,
		})
		l.daemons = map[string]*labrun.Daemon{"client": c.Daemons["node-a"], "server": c.Daemons["node-b"]}
		l.pods, l.configPath, ca = c.Pods, c.ConfigPath, c.CA
	} else {
		c := startCluster(ctx, t, lab, crlConfig, labrun.ClusterOptions{
			Binary: ztunnelBin, Dir: dir, ExtraPods: extra, DaemonEnv: env,
		})
		l.daemons = c.Daemons
		l.pods, l.configPath, ca = c.Pods, c.ConfigPath, c.CA
	}
	echo := startEcho(t, l.pods["server"], 8080)
	l.srv = echo.Addr
	l.ca = tlstest.FromBuiltin(t, ca)
	return l
}

// crl returns a PEM CRL issued by ca revoking serials.
func crl(t *testing.T, ca *tlstest.CA, serials ...*big.Int) []byte {
	t.Helper()
	return tlstest.CRLPEM(ca.CRL(t, serials...))
}

// write replaces the CRL file as an editor would: a new file renamed over
// the old one. It is for files that must not load; a good CRL goes through
// reload, which counts it.
func (l *crlLab) write(t *testing.T, data []byte) {
	t.Helper()
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		t.Fatal(err)
	}
}

// reload writes data, a good CRL file new to the daemons, and waits until
// both have put it in force (each polls the file on its own: a test that
// needs both must wait for both). The wait is for a count of reloads fixed
// by the files written, not one more than the lines logged when reload is
// called: a daemon may still be about to load the previous file then, and
// its line for that one must not pass for this one.
func (l *crlLab) reload(t *testing.T, data []byte) {
	t.Helper()
	l.write(t, data)
	l.reloads++
	for _, d := range l.daemons {
		waitLogCount(t, d, l.reloads, "crl reloaded")
	}
}

// serial returns the serial number of the certificate the daemon of pod
// holds for the pod's identity, from its /config_dump.
func (l *crlLab) serial(t *testing.T, pod string) *big.Int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chain := dumpedChain(ctx, t, l.daemons[pod], pod)
	if len(chain) == 0 {
		t.Fatalf("no certificate for %s in its config dump", pod)
	}
	n, ok := new(big.Int).SetString(chain[0], 10) // decimal, as istioctl parses it
	if !ok {
		t.Fatalf("serial %q", chain[0])
	}
	return n
}

// open connects the client app to the server's echo and checks one round
// trip; the connection stays open.
func (l *crlLab) open(t *testing.T) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.pods["client"].Dial(ctx, "tcp", l.srv.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := nettest.RoundTrip(c, "before"); err != nil {
		c.Close()
		t.Fatalf("echo: %v", err)
	}
	return c
}

// expectNoEcho checks that the client app's connection to the server
// carries nothing: the daemon accepts it (capture) and then ends it.
func (l *crlLab) expectNoEcho(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.pods["client"].Dial(ctx, "tcp", l.srv.String())
	if err != nil {
		return // reset before connect returned
	}
	defer c.Close()
	expectEnded(t, c)
}

// expectEnded checks that c is ended (EOF or reset) without echoing.
func expectEnded(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	_, _ = c.Write([]byte("after"))
	n, err := io.ReadFull(c, make([]byte, 5))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection still carries data: read %d bytes, %v", n, err)
	}
}

// metric sums a daemon's family samples with the labels of want.
func (l *crlLab) metric(t *testing.T, pod, family string, want map[string]string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := l.daemons[pod].Get(ctx, "http://127.0.0.1:15020/metrics")
	if err != nil || code != 200 {
		t.Fatalf("scrape %s: %d %v", pod, code, err)
	}
	return sum(parseMetrics(t, body), family, want)
}

// waitMetric waits until the metric reaches at least min.
func (l *crlLab) waitMetric(t *testing.T, pod, family string, want map[string]string, min float64) {
	t.Helper()
	var got float64
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool { got = l.metric(t, pod, family, want); return got >= min }) {
		t.Fatalf("%s %s%v = %v, want >= %v", pod, family, want, got, min)
	}
}

// logCount counts the lines of a daemon's log that hold every one of parts.
func logCount(d *labrun.Daemon, parts ...string) int {
	n := 0
	for line := range strings.SplitSeq(d.Log(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			n++
		}
	}
	return n
}

// lastLine is the last line of a daemon's log that holds part.
func lastLine(d *labrun.Daemon, part string) string {
	last := ""
	for line := range strings.SplitSeq(d.Log(), "\n") {
		if strings.Contains(line, part) {
			last = line
		}
	}
	return last
}

// waitLogCount waits until logCount reaches min.
func waitLogCount(t *testing.T, d *labrun.Daemon, min int, parts ...string) {
	t.Helper()
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool { return logCount(d, parts...) >= min }) {
		t.Fatalf("daemon %s: %d log lines with %q, want %d", d.Pod.Name, logCount(d, parts...), parts, min)
	}
}

const rejections = "istio_crl_policy_rejections_total"

var (
	destination = map[string]string{"reporter": "destination"}
	source      = map[string]string{"reporter": "source"}
)

// TestCRL runs ztunnel's four CRL scenarios through the daemons (inbound
// refused, outbound refused, open inbound connection terminated on reload,
// open outbound connection terminated on reload), then CRL files that must
// not load, and a CRL issued by an intermediate CA.
func TestCRL(t *testing.T) {
	for _, mode := range []string{"dedicated", "shared"} {
		t.Run(mode, func(t *testing.T) { testCRL(t, mode == "shared") })
	}
}

func testCRL(t *testing.T, shared bool) {
	l := startCRLLab(t, shared)
	cli, srv := l.daemons["client"], l.daemons["server"]
	l.open(t).Close() // both daemons now hold their certificates
	cliSerial, srvSerial := l.serial(t, "client"), l.serial(t, "server")

	t.Run("inbound connection terminated when a reload revokes the client", func(t *testing.T) {
		c := l.open(t)
		defer c.Close()
		l.reload(t, crl(t, l.ca, cliSerial))
		l.waitMetric(t, "server", rejections, destination, 1)
		waitLogCount(t, srv, 1, "terminating inbound connection: peer certificate revoked by CRL update", "spiffe://cluster.local/ns/default/sa/client")
		expectEnded(t, c)
		// The proxied connection is closed with ztunnel's flag.
		l.waitMetric(t, "server", "istio_tcp_connections_closed_total", map[string]string{"reporter": "destination", "response_flags": "CERT_REVOKED"}, 1)
		if got := l.metric(t, "client", rejections, source); got != 0 {
			t.Errorf("the client counted %v rejections; only the server's check revokes here", got)
		}
	})

	t.Run("inbound handshake refused for a revoked client", func(t *testing.T) {
		before := l.metric(t, "server", rejections, destination)
		l.expectNoEcho(t)
		l.waitMetric(t, "server", rejections, destination, before+1)
		waitLogCount(t, srv, 1, "tls handshake", "certificate revoked")
	})

	t.Run("a bad or wrongly signed CRL keeps the last good one", func(t *testing.T) {
		failures := map[string]float64{"client": l.metric(t, "client", "istio_crl_load_failures_total", nil), "server": l.metric(t, "server", "istio_crl_load_failures_total", nil)}
		other, err := caclient.NewBuiltinCA("cluster.local") // same name as the mesh's CA, another key
		if err != nil {
			t.Fatal(err)
		}
		for i, bad := range [][]byte{[]byte("not a valid CRL"), crl(t, tlstest.FromBuiltin(t, other))} {
			l.write(t, bad)
			for _, pod := range []string{"client", "server"} {
				l.waitMetric(t, pod, "istio_crl_load_failures_total", nil, failures[pod]+float64(i+1))
			}
			waitLogCount(t, srv, i+1, "failed to reload crl, keeping the last good one")
			l.expectNoEcho(t)
		}
	})

	t.Run("a CRL revoking nothing lets the client in again", func(t *testing.T) {
		l.reload(t, crl(t, l.ca))
		l.open(t).Close()
	})

	t.Run("outbound connection terminated when a reload revokes the server", func(t *testing.T) {
		c := l.open(t)
		defer c.Close()
		before := l.metric(t, "server", rejections, destination)
		l.reload(t, crl(t, l.ca, srvSerial))
		l.waitMetric(t, "client", rejections, source, 1)
		waitLogCount(t, cli, 1, "terminating outbound connection: upstream certificate revoked by CRL update", "spiffe://cluster.local/ns/default/sa/server")
		expectEnded(t, c)
		l.waitMetric(t, "client", "istio_tcp_connections_closed_total", map[string]string{"reporter": "source", "response_flags": "CERT_REVOKED"}, 1)
		if got := l.metric(t, "server", rejections, destination); got != before {
			t.Errorf("the server counted %v more rejections; only the client's check revokes here", got-before)
		}
	})

	t.Run("outbound handshake refused before any CONNECT to a revoked server", func(t *testing.T) {
		opened := map[string]string{"reporter": "destination"}
		srvOpened := l.metric(t, "server", "istio_tcp_connections_opened_total", opened)
		before := l.metric(t, "client", rejections, source)
		l.expectNoEcho(t)
		l.waitMetric(t, "client", rejections, source, before+1)
		if got := l.metric(t, "server", "istio_tcp_connections_opened_total", opened); got != srvOpened {
			t.Errorf("the server saw %v new connections: a CONNECT got through", got-srvOpened)
		}
	})

	// Checked once, with a dedicated-mode daemon in the pod that has none.
	if !l.shared {
		t.Run("a daemon does not start with a CRL file that does not load", func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "bad-crl.pem")
			if err := os.WriteFile(bad, []byte("-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := labrun.StartDaemon(ctx, l.pods["outsider"], labrun.DaemonOptions{
				Binary: ztunnelBin, ConfigPath: l.configPath,
				CACert: filepath.Join(l.dir, "ca-cert.pem"), CAKey: filepath.Join(l.dir, "ca-key.pem"),
				Workload: "default/outsider/outsider", Env: []string{"CRL_PATH=" + bad},
			})
			if err == nil {
				d.Stop()
				t.Fatal("the daemon started with a CRL file that does not parse")
			}
			if !strings.Contains(err.Error(), "CRL_PATH") {
				t.Fatalf("the error does not name CRL_PATH: %v", err)
			}
		})
		t.Run("a CRL from an issuer that may not sign CRLs says so", func(t *testing.T) {
			// The mesh's root lacks cRLSign; its key signs the CRL through a
			// twin certificate that has it (x509 would not sign otherwise).
			twin := tlstest.NewRoot(t, tlstest.CAOptions{CommonName: "no-crlsign root", Organization: []string{"cluster.local"}, TrustDomains: []string{"cluster.local"}})
			root := tlstest.NewRoot(t, tlstest.CAOptions{CommonName: "no-crlsign root", Organization: []string{"cluster.local"}, TrustDomains: []string{"cluster.local"},
				KeyUsage: x509.KeyUsageCertSign, Key: twin.Key})
			dir := t.TempDir()
			files := map[string][]byte{"ca-cert.pem": root.PEM(), "ca-key.pem": root.KeyPEM(t), "crl.pem": tlstest.CRLPEM(twin.CRL(t))}
			for name, b := range files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := labrun.StartDaemon(ctx, l.pods["outsider"], labrun.DaemonOptions{
				Binary: ztunnelBin, ConfigPath: l.configPath,
				CACert: filepath.Join(dir, "ca-cert.pem"), CAKey: filepath.Join(dir, "ca-key.pem"),
				Workload: "default/outsider/outsider", Env: []string{"CRL_PATH=" + filepath.Join(dir, "crl.pem")},
			})
			if err == nil {
				d.Stop()
				t.Fatal("the daemon started with a CRL its root may not have signed")
			}
			if !strings.Contains(err.Error(), "CRL_PATH") || !strings.Contains(err.Error(), "lacks the cRLSign key usage") {
				t.Fatalf("the error does not say CRL_PATH's issuer lacks cRLSign: %v", err)
			}
		})
	}

	t.Run("CRL issued by an intermediate CA", func(t *testing.T) {
		inter := l.intermediate(t)
		good := leafFrom(t, inter, "spiffe://cluster.local/ns/default/sa/outsider")
		revoked := leafFrom(t, inter, "spiffe://cluster.local/ns/default/sa/outsider")
		// Two CRLs in one file: the intermediate's revokes one of its
		// leaves, the root's revokes nothing (the server is back in).
		l.reload(t, append(crl(t, inter, revoked.Leaf.SerialNumber), crl(t, l.ca)...))
		if !strings.Contains(lastLine(srv, "crl reloaded"), "crls=2") {
			t.Fatalf("the server did not load both CRLs: %s", lastLine(srv, "crl reloaded"))
		}
		l.open(t).Close()

		before := l.metric(t, "server", rejections, destination)
		if err := l.connectAs(t, good); err != nil {
			t.Fatalf("a leaf of the intermediate that is not revoked: %v", err)
		}
		if err := l.connectAs(t, revoked); err == nil {
			t.Fatal("a leaf revoked by the intermediate's CRL got a tunnel")
		}
		l.waitMetric(t, "server", rejections, destination, before+1)
	})
}

// connectAs opens an HBONE tunnel from the outsider pod to the server's
// 15008 with cert (chain [leaf, intermediate]) and echoes once through it.
func (l *crlLab) connectAs(t *testing.T, cert tls.Certificate) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := l.pods["outsider"].Dial(ctx, "tcp", netip.AddrPortFrom(l.srv.Addr(), 15008).String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// The server's certificate is not what this checks.
	tc := tls.Client(raw, &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true,
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		return err
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{})
	if err != nil {
		return err
	}
	defer cc.Close()
	s, err := cc.Connect(ctx, &hbone.Request{Authority: l.srv.String()})
	if err != nil {
		return err
	}
	defer s.Close()
	return nettest.RoundTrip(s, "through the intermediate")
}

// intermediate signs an intermediate CA (allowed to sign CRLs) with the
// mesh's root.
func (l *crlLab) intermediate(t *testing.T) *tlstest.CA {
	t.Helper()
	return l.ca.Intermediate(t, tlstest.CAOptions{
		CommonName: "crl test intermediate", Organization: []string{"cluster.local"}, NotAfter: time.Now().Add(time.Hour),
	})
}

// leafFrom issues a client leaf for uri from the intermediate; the chain
// sent is [leaf, intermediate].
func leafFrom(t *testing.T, inter *tlstest.CA, uri string) tls.Certificate {
	t.Helper()
	return inter.Leaf(t, tlstest.LeafOptions{URIs: []string{uri}, NotAfter: time.Now().Add(time.Hour)}).TLS()
}

// parseMetrics parses a /metrics body.
func parseMetrics(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}
