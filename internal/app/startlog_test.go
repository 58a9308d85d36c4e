package app

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/inpod"
	"github.com/ztunnel-go/ztunnel/proxy"
)

// TestLogStart: the start log carries the version, the mode and the
// configuration, and never the AUTH_TOKEN value or an inline LOCAL_XDS.
func TestLogStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Mode
		want string
	}{
		{"shared", ModeShared, "shared proxy mode - in-pod mode enabled"},
		{"dedicated", ModeDedicated, "proxy mode enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &Config{Mode: tc.mode, AuthToken: "s3cr3t-jwt", LocalXDS: "workloads: [] # inline-marker", ClusterID: "Kubernetes", IstioVersion: "1.27.0"}
			var buf bytes.Buffer
			logStart(slog.New(slog.NewTextHandler(&buf, nil)), cfg, daemonBuildInfo(cfg))
			out := buf.String()
			for _, want := range []string{"version: version.BuildInfo{Version:", `IstioVersion:\"1.27.0\"`, "running with config: ", `\"clusterId\":\"Kubernetes\"`, tc.want} {
				if !strings.Contains(out, want) {
					t.Errorf("start log lacks %q:\n%s", want, out)
				}
			}
			for _, secret := range []string{"s3cr3t-jwt", "inline-marker"} {
				if strings.Contains(out, secret) {
					t.Errorf("start log shows %q:\n%s", secret, out)
				}
			}
		})
	}
}

func TestStamp(t *testing.T) {
	defer func(v, r string) { stampedVersion, stampedRevision = v, r }(stampedVersion, stampedRevision)
	stampedVersion, stampedRevision = "v1.2.3-4-gabc", "abc123"
	bi := buildInfo()
	if bi.Version != "v1.2.3-4-gabc" || bi.GitRevision != "abc123" {
		t.Errorf("buildInfo %+v, want the stamps", bi)
	}
}

// listing is a pod proxy that lists connections, as *proxy.Proxy does.
type listing struct {
	inpod.Proxy
	conns []proxy.Connection
}

func (l listing) Connections() []proxy.Connection { return l.conns }

// TestWorkloadStateConnections: the dump reaches a pod proxy's connections
// through the wrappers the daemon puts around it (DNS, certificate warmer),
// in ztunnel's shape: inbound originalDst is the Forwarded service or null.
func TestWorkloadStateConnections(t *testing.T) {
	conns := []proxy.Connection{
		{Inbound: true, Src: netip.MustParseAddrPort("10.0.0.1:4000"), ActualDst: netip.MustParseAddrPort("10.0.0.2:8080"), ForHost: "web.ns.svc", Protocol: "HBONE"},
		{Inbound: true, Src: netip.MustParseAddrPort("10.0.0.1:4001"), ActualDst: netip.MustParseAddrPort("10.0.0.2:8080"), Protocol: "TCP"},
		{Src: netip.MustParseAddrPort("10.0.0.2:5000"), OriginalDst: netip.MustParseAddrPort("10.96.0.1:80"), ActualDst: netip.MustParseAddrPort("10.0.0.3:15008"), Protocol: "HBONE"},
	}
	w := &certWarmer{}
	wrapped := w.wrap(listing{conns: conns}, "ns", "sa")
	p, ok := wrapped.(interface{ Connections() []proxy.Connection })
	if !ok {
		t.Fatal("the certificate warmer's wrapper hides the proxy's connections")
	}
	d := connectionsDump(p.Connections())
	if len(d.Inbound) != 2 || len(d.Outbound) != 1 || d.Inbound[0].OriginalDst == nil || *d.Inbound[0].OriginalDst != "web.ns.svc" ||
		d.Inbound[1].OriginalDst != nil || d.Outbound[0].ActualDst != "10.0.0.3:15008" || d.Outbound[0].OriginalDst != "10.96.0.1:80" {
		t.Errorf("dump %+v", d)
	}
}
