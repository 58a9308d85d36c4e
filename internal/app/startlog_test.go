package app

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
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
			for _, want := range []string{"version: version.BuildInfo{Version:", `IstioVersion:\"1.27.0\"`, "running with config: ", `\"ClusterID\":\"Kubernetes\"`, tc.want} {
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
