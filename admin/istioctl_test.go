package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// The types below are a port of what istioctl ztunnel-config reads from
// /config_dump (istio/istio istioctl/pkg/writer/ztunnel/configdump/api.go):
// only the fields its summaries print or filter on.
type ictlDump struct {
	Workloads     []*ictlWorkload              `json:"workloads"`
	Services      []*ictlService               `json:"services"`
	Policies      []*ictlPolicy                `json:"policies"`
	Certificates  []*ictlCerts                 `json:"certificates"`
	WorkloadState map[string]ictlWorkloadState `json:"workloadstate"` // istioctl's tag; json matches keys case-insensitively
}

type ictlWorkload struct {
	UID         string   `json:"uid"`
	WorkloadIPs []string `json:"workloadIps"`
	Waypoint    *struct {
		Destination string `json:"destination"`
	} `json:"waypoint,omitempty"`
	Protocol  string `json:"protocol"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Node      string `json:"node"`
	Status    string `json:"status"`
	Hostname  string `json:"hostname"`
	Locality  struct {
		Region string `json:"region,omitempty"`
	} `json:"locality,omitempty"`
}

type ictlService struct {
	Name      string         `json:"name"`
	Namespace string         `json:"namespace"`
	Hostname  string         `json:"hostname"`
	Addresses []string       `json:"vips"`
	Ports     map[string]int `json:"ports"`
	Endpoints map[string]*struct {
		WorkloadUID string            `json:"workloadUid"`
		Port        map[uint16]uint16 `json:"port"`
	} `json:"endpoints"`
}

type ictlPolicy struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"`
	Action    string `json:"action"`
}

type ictlCerts struct {
	Identity  string      `json:"identity"`
	State     string      `json:"state"`
	CertChain []*ictlCert `json:"certChain"`
	RootCert  []*ictlCert `json:"rootCerts"`
}

type ictlCert struct {
	Pem            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

type ictlWorkloadState struct {
	State       string `json:"state,omitempty"`
	Connections struct {
		Inbound  []ictlConn `json:"inbound"`
		Outbound []ictlConn `json:"outbound"`
	} `json:"connections,omitempty"`
	Info struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"info"`
}

type ictlConn struct {
	Src         string  `json:"src"`
	OriginalDst *string `json:"originalDst"`
	ActualDst   string  `json:"actualDst"`
	Protocol    string  `json:"protocol"`
}

// flakySource issues through a real CA, except that one identity's fetch
// fails and another's never ends (until the test does).
type flakySource struct {
	mtls.Source
	fail, hang identity.Identity
	done       chan struct{}
}

func (s *flakySource) Fetch(ctx context.Context, id identity.Identity) (*mtls.WorkloadCert, error) {
	switch id {
	case s.fail:
		return nil, errors.New("CA refused the CSR")
	case s.hang:
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, errors.New("test over")
		}
	}
	return s.Source.Fetch(ctx, id)
}

// TestConfigDumpAsIstioctlReadsIt fetches /config_dump over HTTP and reads
// every section the way istioctl ztunnel-config does (workload, service,
// policy, certificate and connection summaries), failing on a field it
// could not parse or that is empty where istioctl prints it.
func TestConfigDumpAsIstioctlReadsIt(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot([]byte(dumpConfig))
	if err != nil {
		t.Fatal(err)
	}
	ca := tlstest.NewCA(t, "cluster.local")
	good, bad, pending := identity.New("", "ns1", "sa-a"), identity.New("", "ns1", "sa-bad"), identity.New("", "ns1", "sa-pending")
	src := &flakySource{Source: caclient.New(caclient.Config{Signer: ca}), fail: bad, hang: pending, done: make(chan struct{})}
	certs := mtls.NewStore(mtls.StoreConfig{Source: src})
	t.Cleanup(func() { close(src.done); certs.Close() })
	if _, err := certs.Get(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Get(context.Background(), bad); err == nil {
		t.Fatal("the failing identity got a certificate")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	_, _ = certs.Get(ctx, pending) // starts the fetch that never ends
	cancel()

	forHost := "svc.ns1.svc.cluster.local"
	s := NewServer(Config{State: state.NewStore(snap), Certs: certs, WorkloadState: func() map[string]WorkloadStateDump {
		return map[string]WorkloadStateDump{"uid-a": {
			Info: map[string]string{"name": "a", "namespace": "ns1", "serviceAccount": "sa-a"}, State: "Up",
			Connections: &ConnectionsDump{
				Inbound: []InboundConnDump{
					{Src: "10.0.0.9:40000", OriginalDst: &forHost, ActualDst: "10.0.0.1:8080", Protocol: "HBONE"},
					{Src: "10.0.0.9:40001", ActualDst: "10.0.0.1:8080", Protocol: "TCP"},
				},
				Outbound: []OutboundConnDump{{Src: "10.0.0.1:5000", OriginalDst: "10.96.0.1:80", ActualDst: "10.0.0.7:15008", Protocol: "HBONE"}},
			},
		}}
	},
		// ztunnel-go's own section, a key istioctl does not know.
		Engine: func() EngineDump { return EngineDump{Backend: "epoll", Loops: 2, StreamLoops: 2, Relays: 3} },
	})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/config_dump")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var d ictlDump
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&d); err != nil {
		t.Fatalf("istioctl cannot parse the dump: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["engine"]; !ok {
		t.Fatal("the dump istioctl parsed has no engine section: the unknown key was not exercised")
	}

	t.Run("workloads", func(t *testing.T) {
		if len(d.Workloads) != 1 {
			t.Fatalf("%d workloads", len(d.Workloads))
		}
		w := d.Workloads[0]
		if w.Namespace == "" || w.Name == "" || (len(w.WorkloadIPs) == 0 && w.Hostname == "") || w.Node == "" || w.Protocol == "" || w.UID == "" {
			t.Errorf("workload summary row has an empty column: %+v", w)
		}
	})
	t.Run("services", func(t *testing.T) {
		byUID := map[string]*ictlWorkload{}
		for _, w := range d.Workloads {
			byUID[w.UID] = w
		}
		for _, svc := range d.Services {
			for _, a := range svc.Addresses {
				if _, ip, ok := strings.Cut(a, "/"); !ok || net.ParseIP(ip) == nil {
					t.Errorf("service %s VIP %q is not network/ip", svc.Name, a)
				}
			}
			healthy := 0
			for _, ep := range svc.Endpoints {
				if w := byUID[ep.WorkloadUID]; w != nil && w.Status == "Healthy" {
					healthy++
				}
			}
			if svc.Namespace == "" || svc.Name == "" || len(svc.Endpoints) == 0 || healthy != len(svc.Endpoints) {
				t.Errorf("service %+v: %d/%d healthy endpoints", svc, healthy, len(svc.Endpoints))
			}
		}
	})
	t.Run("policies", func(t *testing.T) {
		for _, p := range d.Policies {
			if p.Namespace == "" || p.Name == "" || p.Action == "" || p.Scope == "" {
				t.Errorf("policy summary row has an empty column: %+v", p)
			}
		}
		if len(d.Policies) != 1 {
			t.Errorf("%d policies", len(d.Policies))
		}
	})
	t.Run("certificates", func(t *testing.T) {
		states := map[string]string{}
		for _, c := range d.Certificates {
			states[c.Identity] = c.State
			if strings.Contains(c.State, "Unavailable") || c.State == "Initializing" {
				if len(c.CertChain) != 0 {
					t.Errorf("%s: %s with a chain", c.Identity, c.State)
				}
				continue
			}
			if len(c.CertChain) == 0 || len(c.RootCert) == 0 {
				t.Fatalf("%s: %s without chain or roots", c.Identity, c.State)
			}
			for _, cert := range append(append([]*ictlCert{}, c.CertChain...), c.RootCert...) {
				n, ok := new(big.Int).SetString(cert.SerialNumber, 10)
				if !ok || n.Sign() <= 0 {
					t.Errorf("%s: serial %q is not a decimal number", c.Identity, cert.SerialNumber)
				}
				from, ferr := time.Parse(time.RFC3339, cert.ValidFrom)
				to, terr := time.Parse(time.RFC3339, cert.ExpirationTime)
				if ferr != nil || terr != nil || !time.Now().After(from) || !time.Now().Before(to) {
					t.Errorf("%s: validity %q..%q not valid now (%v, %v)", c.Identity, cert.ValidFrom, cert.ExpirationTime, ferr, terr)
				}
				if cert.Pem == "" {
					t.Errorf("%s: no pem", c.Identity)
				}
			}
		}
		if states[good.String()] != "Available" || states[pending.String()] != "Initializing" ||
			!strings.HasPrefix(states[bad.String()], "Unavailable: ") || !strings.Contains(states[bad.String()], "CA refused the CSR") {
			t.Errorf("states %v", states)
		}
	})
	t.Run("connections", func(t *testing.T) {
		ws, ok := d.WorkloadState["uid-a"]
		if !ok || ws.Info.Name != "a" || ws.Info.Namespace != "ns1" {
			t.Fatalf("workload state %+v", d.WorkloadState)
		}
		for _, c := range append(append([]ictlConn{}, ws.Connections.Inbound...), ws.Connections.Outbound...) {
			for _, a := range []string{c.Src, c.ActualDst} {
				if _, _, err := net.SplitHostPort(a); err != nil {
					t.Errorf("connection address %q: %v", a, err)
				}
			}
			if c.Protocol != "TCP" && c.Protocol != "HBONE" && c.Protocol != "DOUBLEHBONE" {
				t.Errorf("connection protocol %q", c.Protocol)
			}
		}
		if len(ws.Connections.Inbound) != 2 || len(ws.Connections.Outbound) != 1 || ws.Connections.Outbound[0].OriginalDst == nil ||
			ws.Connections.Inbound[0].OriginalDst == nil || ws.Connections.Inbound[1].OriginalDst != nil {
			t.Errorf("connections %+v", ws.Connections)
		}
	})
}

// TestConfigDumpServiceFamiliesAndLoadBalancer checks the service fields the
// dump once left out (found by istiolab's TestIstioctl: istiod sends
// IPV4_ONLY for a single-stack Kubernetes Service, which ztunnel dumps as
// "ipFamilies": "IPv4"; cidrVips, which istioctl also reads, and
// weightedWaypoints were missing the same way): each is rendered as ztunnel's
// serde does, and omitted at its default (Automatic, no load balancing, none)
// as ztunnel skips a None or an empty list.
func TestConfigDumpServiceFamiliesAndLoadBalancer(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot([]byte(`
services:
- name: set
  namespace: ns1
  hostname: set.ns1.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
  ipFamilies: IPv4
  cidrVips: [{network: "", cidr: 10.97.0.0/24}]
  weightedWaypoints:
  - {destination: {destination: "/10.0.0.5", hboneMtlsPort: 15008}, weight: 90}
  loadBalancer:
    routingPreferences: [Network, Zone]
    mode: Failover
    healthPolicy: AllowAll
- name: unset
  namespace: ns1
  hostname: unset.ns1.svc.cluster.local
  vips: ["/10.96.0.3"]
  ports: {80: 8080}
`))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewServer(Config{State: state.NewStore(snap)}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/config_dump")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Services []map[string]json.RawMessage `json:"services"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"set": {
			"ipFamilies":        `"IPv4"`,
			"loadBalancer":      `{"routingPreferences":["Network","Zone"],"mode":"Failover","healthPolicy":"AllowAll"}`,
			"cidrVips":          `[{"network":"","cidr":"10.97.0.0/24"}]`,
			"weightedWaypoints": `[{"destination":{"destination":"/10.0.0.5","hboneMtlsPort":15008},"weight":90}]`,
		},
		"unset": {"ipFamilies": "", "loadBalancer": "", "cidrVips": "", "weightedWaypoints": ""},
	}
	for _, s := range d.Services {
		var name string
		if err := json.Unmarshal(s["name"], &name); err != nil {
			t.Fatal(err)
		}
		for key, w := range want[name] {
			var got bytes.Buffer
			if len(s[key]) > 0 {
				if err := json.Compact(&got, s[key]); err != nil {
					t.Fatal(err)
				}
			}
			if got.String() != w {
				t.Errorf("service %s: %q is %s, want %s", name, key, got.String(), w)
			}
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Errorf("services missing from the dump: %v", want)
	}
}
