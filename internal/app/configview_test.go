package app

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestZtunnelView: the configuration an operator reads is in ztunnel's
// shape, so jq paths written for ztunnel's /config_dump work: camelCase
// keys, serde's Duration and enum encodings, null for unset options, our
// own settings under "ztunnelGo" only.
func TestZtunnelView(t *testing.T) {
	cfg, err := ParseEnv(lookupFrom(map[string]string{
		"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa", "LOCAL_XDS": "workloads: []",
		"POD_NAME": "ztunnel-x", "POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "ztunnel",
		"SECRET_TTL": "1h30m", "AUTH_TOKEN": "s3cr3t", "UNSTABLE_ENABLE_SOCKS5": "true",
	}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ztunnelView(cfg, []string{"ISTIO_META_FOO=bar", "XDS_HEADER_x-a=1"}, []string{"ztunnel", "proxy", "ztunnel"}))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"proxyMode":                `"Dedicated"`,
		"proxyWorkloadInformation": `{"name":"a","namespace":"ns","serviceAccount":"sa"}`,
		"secretTtl":                `{"nanos":0,"secs":5400}`,
		"selfTerminationDeadline":  `{"nanos":0,"secs":5}`,
		"adminAddr":                `{"Localhost":[true,15000]}`,
		"statsAddr":                `{"SocketAddr":"[::]:15020"}`,
		"inboundAddr":              `"[::]:15008"`,
		"dnsProxyAddr":             `{"Localhost":[true,15053]}`,
		"illegalPorts":             `[15001,15006,15008,15080]`,
		"socks5Addr":               `"127.0.0.1:15080"`,
		"xdsAddress":               `null`,
		"caAddress":                `null`,
		"localNode":                `null`,
		"xdsRootCert":              `{"File":"./var/run/secrets/istio/root-cert.pem"}`,
		"socketConfig":             `{"keepaliveEnabled":true,"keepaliveInterval":{"nanos":0,"secs":180},"keepaliveRetries":9,"keepaliveTime":{"nanos":0,"secs":180},"userTimeoutEnabled":false}`,
		"proxyMetadata":            `{"FOO":"bar"}`,
		"xdsHeaders":               `[["x-a","1"]]`,
		"proxyArgs":                `"proxy ztunnel"`,
		"ztunnelIdentity":          `"spiffe://cluster.local/ns/istio-system/sa/ztunnel"`,
		"ipv6Enabled":              `true`,
	}
	for key, w := range want {
		v, ok := got[key]
		if !ok {
			t.Errorf("no key %q", key)
			continue
		}
		vb, _ := json.Marshal(v)
		if string(vb) != w {
			t.Errorf("%s = %s, want %s", key, vb, w)
		}
	}
	if _, ok := got["ztunnelGo"].(map[string]any)["engine"]; !ok {
		t.Error("our engine setting is not under ztunnelGo")
	}
	for _, goName := range []string{"Mode", "SecretTTL", "AuthToken", "LocalXDS", "Engine"} {
		if _, ok := got[goName]; ok {
			t.Errorf("Go field name %q at the top level", goName)
		}
	}
	if s := string(b); strings.Contains(s, "s3cr3t") || strings.Contains(s, "workloads: []") {
		t.Errorf("secrets in the view: %s", s)
	}
}
