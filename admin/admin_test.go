package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

const dumpConfig = `
workloads:
- uid: cluster1//v1/Pod/ns1/a
  name: a
  namespace: ns1
  serviceAccount: sa-a
  workloadIps: ["10.0.0.1"]
  protocol: HBONE
  node: n1
  services:
    "ns1/svc.ns1.svc.cluster.local":
      80: 8080
policies:
- name: p1
  namespace: ns1
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - principals: [{Prefix: "cluster.local/ns/bad"}]
        notDestinationPorts: [15021]
services:
- name: svc
  namespace: ns1
  hostname: svc.ns1.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
`

func testServer(t *testing.T) *Server {
	t.Helper()
	snap, err := xdsconv.LocalSnapshot([]byte(dumpConfig))
	if err != nil {
		t.Fatal(err)
	}
	return NewServer(Config{State: state.NewStore(snap), StaticConfig: snap})
}

func TestConfigDumpShape(t *testing.T) {
	s := testServer(t)
	req := httptest.NewRequest(http.MethodGet, "/config_dump", nil)
	req.RemoteAddr = "127.0.0.1:5555"
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	// Decode generically: the keys are the contract istioctl relies on.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workloads", "services", "policies", "stagedServices", "staticConfig", "version", "config", "certificates"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("config dump lacks %q", k)
		}
	}
	var d ConfigDump
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Workloads) != 1 || d.Workloads[0].UID != "cluster1//v1/Pod/ns1/a" || d.Workloads[0].WorkloadIPs[0] != "10.0.0.1" ||
		d.Workloads[0].Protocol != "HBONE" || d.Workloads[0].ServiceAccount != "sa-a" {
		t.Errorf("workloads: %+v", d.Workloads)
	}
	if len(d.Services) != 1 || d.Services[0].VIPs[0] != "/10.96.0.1" || d.Services[0].Ports["80"] != 8080 ||
		d.Services[0].Endpoints["cluster1//v1/Pod/ns1/a"].Port["80"] != 8080 {
		t.Errorf("services: %+v", d.Services)
	}
	if len(d.Policies) != 1 || d.Policies[0].Action != "Deny" || d.Policies[0].Scope != "Namespace" {
		t.Fatalf("policies: %+v", d.Policies)
	}
	m := d.Policies[0].Rules[0][0][0]
	if m.Principals[0]["Prefix"] != "cluster.local/ns/bad" || m.NotDestinationPorts[0] != 15021 {
		t.Errorf("policy match: %+v", m)
	}
	if len(d.StaticConfig.Workloads) != 1 {
		t.Errorf("staticConfig: %+v", d.StaticConfig)
	}
}

func TestAdminRefusesRemoteClients(t *testing.T) {
	s := testServer(t)
	for _, tc := range []struct {
		remote string
		want   int
	}{{"127.0.0.1:1", 200}, {"[::1]:1", 200}, {"10.0.0.5:1", 403}, {"garbage", 403}} {
		req := httptest.NewRequest(http.MethodGet, "/config_dump", nil)
		req.RemoteAddr = tc.remote
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("remote %s: status %d, want %d", tc.remote, rec.Code, tc.want)
		}
	}
}

func TestQuitNeedsPost(t *testing.T) {
	quit := 0
	s := NewServer(Config{State: state.NewStore(state.Empty()), Quit: func() { quit++ }})
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		req := httptest.NewRequest(m, "/quitquitquit", nil)
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if m == http.MethodGet && rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET /quitquitquit: %d", rec.Code)
		}
	}
	if quit != 1 {
		t.Fatalf("quit called %d times, want 1", quit)
	}
}

func TestReadiness(t *testing.T) {
	r := NewReadiness()
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz/ready", nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}
	doneA := r.Register("proxy")
	doneB := r.Register("state manager")
	if code, body := get(); code != 500 || !strings.Contains(body, "proxy, state manager") {
		t.Fatalf("pending: %d %q", code, body)
	}
	doneA()
	doneA() // idempotent
	if code, body := get(); code != 500 || strings.Contains(body, "proxy") {
		t.Fatalf("one pending: %d %q", code, body)
	}
	doneB()
	if code, body := get(); code != 200 || body != "ready\n" {
		t.Fatalf("ready: %d %q", code, body)
	}
}
