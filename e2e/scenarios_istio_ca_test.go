package e2e

// istio/istio's cacert_rotation TestIntermediateCertificateRefresh (skipped
// upstream, istio#49648) in the lab: the CA changes its intermediate and
// ztunnel's refreshed certificates chain to the new one.

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

const istioCARotationTopology = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

// TestIstioIntermediateCertificateRefresh: two captured pods on two nodes,
// on xDS and the Istio CA with 6 s certificates. Once the CA signs through a
// new intermediate, each daemon's /config_dump shows its pod's refreshed
// chain as [leaf, the new intermediate] with the intermediate's serial in
// decimal (what istioctl compares), and traffic still flows both ways; the
// way back is a new HBONE connection, so its handshake uses the refreshed
// chains on both daemons, checked against the unchanged root.
func TestIstioIntermediateCertificateRefresh(t *testing.T) {
	lab := netnslab.New(t)
	cp := startControlPlane(t, lab)
	cp.xds.Set(xdsconv.AddressType, "u-client", "1", xdsWorkload("client", "10.244.1.2", "node-a"))
	cp.xds.Set(xdsconv.AddressType, "u-server", "1", xdsWorkload("server", "10.244.2.2", "node-b"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, istioCARotationTopology, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: append(cp.env(), "SECRET_TTL=6s"),
	})
	echo := func(from, to string) {
		t.Helper()
		srv := servePod(t, c.Pods[to], 9090, nettest.Echo)
		defer srv.Close()
		conn, err := c.Pods[from].Dial(ctx, "tcp", net.JoinHostPort(c.Pods[to].IP.String(), "9090"))
		if err != nil {
			t.Fatalf("%s to %s: %v", from, to, err)
		}
		defer conn.Close()
		if err := nettest.RoundTrip(conn, "ping"); err != nil {
			t.Fatalf("%s to %s: echo: %v", from, to, err)
		}
	}
	echo("client", "server")
	for _, pod := range []string{"client", "server"} {
		if chain := dumpedChain(ctx, t, c.Daemons[pod], pod); len(chain) != 1 {
			t.Fatalf("%s before the rotation: chain of %d certificates, want the root-signed leaf alone", pod, len(chain))
		}
	}

	inter := cp.ca.UseIntermediate(t)
	for _, pod := range []string{"client", "server"} {
		var chain []string
		if !nettest.Until(30*time.Second, func() bool {
			chain = dumpedChain(ctx, t, c.Daemons[pod], pod)
			return len(chain) == 2 && chain[1] == inter.SerialNumber.String()
		}) {
			t.Fatalf("%s: chain %v 30 s after the rotation, want [leaf, %s]", pod, chain, inter.SerialNumber)
		}
	}
	echo("client", "server")
	echo("server", "client")
}

// dumpedChain returns the decimal serials of the certificate chain d's
// /config_dump shows for pod's identity (service account = pod name).
func dumpedChain(ctx context.Context, t *testing.T, d *labrun.Daemon, pod string) []string {
	t.Helper()
	var dump struct {
		Certificates []struct {
			Identity  string `json:"identity"`
			CertChain []struct {
				SerialNumber string `json:"serialNumber"`
			} `json:"certChain"`
		} `json:"certificates"`
	}
	readConfigDump(ctx, t, d, &dump)
	for _, cert := range dump.Certificates {
		if strings.HasSuffix(cert.Identity, "/sa/"+pod) {
			var serials []string
			for _, c := range cert.CertChain {
				serials = append(serials, c.SerialNumber)
			}
			return serials
		}
	}
	return nil
}

// TestCertificateRecoversWithoutTraffic (issue 34): the CA is down when the
// daemons start, so each pod's certificate is Unavailable in /config_dump;
// once the CA is back the daemon's own retries (with backoff, as ztunnel's
// identity manager) make it Available, with no connection asking for it.
func TestCertificateRecoversWithoutTraffic(t *testing.T) {
	lab := netnslab.New(t)
	cp := startControlPlane(t, lab)
	cp.xds.Set(xdsconv.AddressType, "u-client", "1", xdsWorkload("client", "10.244.1.2", "node-a"))
	cp.xds.Set(xdsconv.AddressType, "u-server", "1", xdsWorkload("server", "10.244.2.2", "node-b"))
	cp.ca.SetFailing(status.Error(codes.Unavailable, "istiod is restarting"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, istioCARotationTopology, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: cp.env(),
	})
	d := c.Daemons["client"]
	// Logged under ztunnel's targets (issue 34), so alerts carry over.
	if _, err := d.WaitLog(ctx, "\txds::client\txds synced"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WaitLog(ctx, "\tidentity::manager\t", "certificate fetch failed"); err != nil {
		t.Fatal(err)
	}
	waitState := func(want string, within time.Duration) {
		t.Helper()
		var state string
		if !nettest.Until(within, func() bool {
			state = dumpedCertState(ctx, t, d, "client")
			return strings.HasPrefix(state, want)
		}) {
			t.Fatalf("client's certificate %q after %s, want %s", state, within, want)
		}
		t.Logf("client's certificate: %s", state)
	}
	waitState("Unavailable", 30*time.Second)
	cp.ca.SetFailing(nil)
	// The first retries come 1, 2, 4, 8 s after the failure (±20%).
	waitState("Available", 30*time.Second)
}

// dumpedCertState is the state /config_dump shows for pod's certificate,
// "" when it lists none.
func dumpedCertState(ctx context.Context, t *testing.T, d *labrun.Daemon, pod string) string {
	t.Helper()
	var dump struct {
		Certificates []struct {
			Identity string `json:"identity"`
			State    string `json:"state"`
		} `json:"certificates"`
	}
	readConfigDump(ctx, t, d, &dump)
	for _, cert := range dump.Certificates {
		if strings.HasSuffix(cert.Identity, "/sa/"+pod) {
			return cert.State
		}
	}
	return ""
}

// readConfigDump decodes d's /config_dump into v.
func readConfigDump(ctx context.Context, t *testing.T, d *labrun.Daemon, v any) {
	t.Helper()
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
	if err != nil || code != 200 {
		t.Fatalf("config_dump: %d %v", code, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatal(err)
	}
}
