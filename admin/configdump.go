package admin

import (
	"encoding/pem"
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/state"
)

// ConfigDump is the /config_dump document, in the JSON shape of ztunnel's
// (the keys istioctl ztunnel-config reads).
type ConfigDump struct {
	Workloads      []WorkloadDump               `json:"workloads"`
	Services       []ServiceDump                `json:"services"`
	Policies       []PolicyDump                 `json:"policies"`
	StagedServices map[string]map[string]any    `json:"stagedServices"`
	StaticConfig   StaticDump                   `json:"staticConfig"`
	Version        BuildInfo                    `json:"version"`
	Config         any                          `json:"config"`
	Certificates   []CertsDump                  `json:"certificates"`
	WorkloadState  map[string]WorkloadStateDump `json:"workloadState,omitempty"`
	// Engine is ztunnel-go's own: the relay engine's backend and load.
	// istioctl ignores keys it does not know.
	Engine *EngineDump `json:"engine,omitempty"`
}

// EngineDump is the relay engine's section of the dump (ztunnel-go only):
// the backend that runs (ZTUNNEL_ENGINE, after any fallback), its loops and
// the relays and buffers they hold now.
type EngineDump struct {
	Backend string `json:"backend"`
	// Fallback says why another backend than the one asked for runs.
	Fallback string `json:"fallback,omitempty"`
	// Loops run TCP⇄TCP relays, StreamLoops TCP⇄HBONE-stream relays (the
	// epoll backend's); Running is how many of either run right now.
	Loops       int `json:"loops"`
	StreamLoops int `json:"streamLoops"`
	Running     int `json:"running"`
	// Relays are the live relays, LoopRelays those held by event loops.
	Relays     int `json:"relays"`
	LoopRelays int `json:"loopRelays"`
	// PipesInUse hold bytes in flight, PipesFree are pooled for reuse;
	// StreamBuffers are the buffers stream relays hold for bytes in flight.
	PipesInUse    int `json:"pipesInUse"`
	PipesFree     int `json:"pipesFree"`
	StreamBuffers int `json:"streamBuffers"`
	// Conns are the HBONE connections the loops own (proxy.LoopDrive),
	// ConnStalls the driver calls that held a loop over a millisecond,
	// LocalWakes the relays readied on their connection's loop without a
	// task.
	Conns      int   `json:"conns"`
	ConnStalls int64 `json:"connStalls"`
	LocalWakes int64 `json:"localWakes"`
}

// StaticDump is the local config as loaded, in ztunnel's LocalConfig shape.
type StaticDump struct {
	Workloads []WorkloadDump `json:"workloads"`
	Services  []ServiceDump  `json:"services"`
	Policies  []PolicyDump   `json:"policies"`
}

func dumpSnapshot(snap *state.Snapshot) ([]WorkloadDump, []ServiceDump, []PolicyDump) {
	ws, ss, ps := []WorkloadDump{}, []ServiceDump{}, []PolicyDump{}
	for _, w := range snap.Workloads() {
		ws = append(ws, dumpWorkload(w))
	}
	for _, svc := range snap.Services() {
		ss = append(ss, dumpService(snap, svc))
	}
	for _, p := range snap.Policies() {
		ps = append(ps, dumpPolicy(p))
	}
	return ws, ss, ps
}

// BuildInfo is the version block of the dump.
type BuildInfo struct {
	Version      string `json:"version"`
	GitRevision  string `json:"gitRevision"`
	GoVersion    string `json:"rustVersion"`
	BuildProfile string `json:"buildProfile"`
	BuildStatus  string `json:"buildStatus"`
	GitTag       string `json:"gitTag"`
	IstioVersion string `json:"istioVersion"`
}

// WorkloadDump is one workload as ztunnel dumps it (camelCase, defaults omitted).
type WorkloadDump struct {
	WorkloadIPs           []string          `json:"workloadIps"`
	Waypoint              *GatewayDump      `json:"waypoint,omitempty"`
	NetworkGateway        *GatewayDump      `json:"networkGateway,omitempty"`
	Protocol              string            `json:"protocol"`
	NetworkMode           string            `json:"networkMode"`
	UID                   string            `json:"uid,omitempty"`
	Name                  string            `json:"name"`
	Namespace             string            `json:"namespace"`
	TrustDomain           string            `json:"trustDomain,omitempty"`
	ServiceAccount        string            `json:"serviceAccount,omitempty"`
	Network               string            `json:"network,omitempty"`
	WorkloadName          string            `json:"workloadName,omitempty"`
	WorkloadType          string            `json:"workloadType,omitempty"`
	CanonicalName         string            `json:"canonicalName,omitempty"`
	CanonicalRevision     string            `json:"canonicalRevision,omitempty"`
	Hostname              string            `json:"hostname,omitempty"`
	Node                  string            `json:"node,omitempty"`
	AuthorizationPolicies []string          `json:"authorizationPolicies,omitempty"`
	Status                string            `json:"status"`
	ClusterID             string            `json:"clusterId"`
	Services              []string          `json:"services,omitempty"`
	Capacity              uint32            `json:"capacity"`
	Locality              map[string]string `json:"locality,omitempty"`
}

// GatewayDump is a waypoint or network gateway address.
type GatewayDump struct {
	Destination   string `json:"destination"`
	HBONEMTLSPort uint16 `json:"hboneMtlsPort"`
}

// EndpointDump is one endpoint of a service.
type EndpointDump struct {
	WorkloadUID string            `json:"workloadUid"`
	Port        map[string]uint16 `json:"port"`
	Status      string            `json:"status"`
}

// ServiceDump is one service as ztunnel dumps it.
type ServiceDump struct {
	Name              string                  `json:"name"`
	Namespace         string                  `json:"namespace"`
	Hostname          string                  `json:"hostname"`
	VIPs              []string                `json:"vips"`
	CIDRVIPs          []CIDRDump              `json:"cidrVips,omitempty"`
	Ports             map[string]uint16       `json:"ports"`
	Endpoints         map[string]EndpointDump `json:"endpoints"`
	SubjectAltNames   []string                `json:"subjectAltNames"`
	Waypoint          *GatewayDump            `json:"waypoint,omitempty"`
	WeightedWaypoints []WeightedWaypointDump  `json:"weightedWaypoints,omitempty"`
	// LoadBalancer and IPFamilies are omitted at their defaults (no load
	// balancing configuration, Automatic), as ztunnel skips them when None.
	LoadBalancer *LoadBalancerDump `json:"loadBalancer,omitempty"`
	IPFamilies   string            `json:"ipFamilies,omitempty"`
	Canonical    bool              `json:"canonical"`
	Visibility   string            `json:"visibility"`
}

// CIDRDump is a service's CIDR VIP: an object, as ztunnel's NetworkCidr
// (unlike a VIP, which is a "network/ip" string).
type CIDRDump struct {
	Network string `json:"network"`
	CIDR    string `json:"cidr"`
}

// WeightedWaypointDump is one of a service's weighted waypoints.
type WeightedWaypointDump struct {
	Destination GatewayDump `json:"destination"`
	Weight      uint32      `json:"weight"`
}

// LoadBalancerDump is a service's load balancing as ztunnel dumps it.
type LoadBalancerDump struct {
	RoutingPreferences []string `json:"routingPreferences"`
	Mode               string   `json:"mode"`
	HealthPolicy       string   `json:"healthPolicy"`
}

// PolicyDump is one authorization policy as ztunnel dumps it.
type PolicyDump struct {
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Scope     string          `json:"scope"`
	Action    string          `json:"action"`
	Rules     [][][]MatchDump `json:"rules"`
	DryRun    bool            `json:"dryRun"`
}

// MatchDump is one match of a policy rule; empty fields are omitted.
type MatchDump struct {
	Namespaces          []map[string]any `json:"namespaces,omitempty"`
	NotNamespaces       []map[string]any `json:"notNamespaces,omitempty"`
	ServiceAccounts     []SADump         `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []SADump         `json:"notServiceAccounts,omitempty"`
	Principals          []map[string]any `json:"principals,omitempty"`
	NotPrincipals       []map[string]any `json:"notPrincipals,omitempty"`
	SourceIPs           []string         `json:"sourceIps,omitempty"`
	NotSourceIPs        []string         `json:"notSourceIps,omitempty"`
	DestinationIPs      []string         `json:"destinationIps,omitempty"`
	NotDestinationIPs   []string         `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint16         `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint16         `json:"notDestinationPorts,omitempty"`
}

// SADump is a service-account match.
type SADump struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// CertsDump is one identity's certificate state.
type CertsDump struct {
	Identity  string     `json:"identity"`
	State     string     `json:"state"`
	CertChain []CertDump `json:"certChain"`
	RootCerts []CertDump `json:"rootCerts"`
}

// CertDump is one certificate: base64 PEM, serial and validity.
type CertDump struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

// WorkloadStateDump is one in-pod workload's state (shared mode), with
// its proxy's open connections once it is up, as ztunnel dumps them.
type WorkloadStateDump struct {
	Info        map[string]string `json:"info"`
	State       string            `json:"state"`
	Connections *ConnectionsDump  `json:"connections,omitempty"`
}

// ConnectionsDump is a proxy's open connections (ztunnel's connection
// manager dump, which istioctl ztunnel-config connections prints).
type ConnectionsDump struct {
	Inbound  []InboundConnDump  `json:"inbound"`
	Outbound []OutboundConnDump `json:"outbound"`
}

// InboundConnDump is one authorized inbound connection: the client, the
// service it named (Forwarded host=; null when none), the app address it
// reached, and HBONE or TCP (plaintext).
type InboundConnDump struct {
	Src         string  `json:"src"`
	OriginalDst *string `json:"originalDst"`
	ActualDst   string  `json:"actualDst"`
	Protocol    string  `json:"protocol"`
}

// OutboundConnDump is one outbound connection: the app, the destination it
// asked for, the address dialled, and TCP, HBONE or DOUBLEHBONE.
type OutboundConnDump struct {
	Src         string `json:"src"`
	OriginalDst string `json:"originalDst"`
	ActualDst   string `json:"actualDst"`
	Protocol    string `json:"protocol"`
}

func dumpWorkload(w *state.Workload) WorkloadDump {
	d := WorkloadDump{
		Protocol: w.Protocol.String(), NetworkMode: w.NetworkMode.String(), UID: w.UID, Name: w.Name,
		Namespace: w.Namespace(), TrustDomain: w.TrustDomain(), ServiceAccount: w.ServiceAccount(),
		Network: w.Network(), WorkloadName: w.WorkloadName(), WorkloadType: w.WorkloadType(),
		CanonicalName: w.CanonicalName(), CanonicalRevision: w.CanonicalRevision(), Hostname: w.Hostname(),
		Node: w.Node(), AuthorizationPolicies: w.AuthorizationPolicies(), Status: w.Status.String(),
		ClusterID: w.ClusterID(), Capacity: w.Capacity,
		Waypoint: dumpGateway(w.Waypoint()), NetworkGateway: dumpGateway(w.NetworkGateway()),
	}
	d.WorkloadIPs = make([]string, 0, len(w.Addresses))
	for _, a := range w.Addresses {
		d.WorkloadIPs = append(d.WorkloadIPs, a.String())
	}
	for _, sp := range w.Services.List() {
		d.Services = append(d.Services, sp.Key) // sorted
	}
	if l := w.Locality(); l != (state.Locality{}) {
		d.Locality = map[string]string{"region": l.Region, "zone": l.Zone, "subzone": l.Subzone}
	}
	return d
}

func dumpGateway(g *state.GatewayAddress) *GatewayDump {
	if g == nil {
		return nil
	}
	return &GatewayDump{Destination: g.Destination(), HBONEMTLSPort: g.HBONEMTLSPort}
}

func portMap(m map[uint16]uint16) map[string]uint16 {
	out := make(map[string]uint16, len(m))
	for k, v := range m {
		out[strconv.Itoa(int(k))] = v
	}
	return out
}

func dumpService(snap *state.Snapshot, s *state.Service) ServiceDump {
	d := ServiceDump{
		Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, Ports: portMap(s.Ports),
		SubjectAltNames: s.SubjectAltNames(), Canonical: s.Canonical, Visibility: s.Visibility.String(),
		Waypoint: dumpGateway(s.Waypoint), Endpoints: map[string]EndpointDump{},
	}
	if d.SubjectAltNames == nil {
		d.SubjectAltNames = []string{}
	}
	for _, c := range s.CIDRVIPs() {
		d.CIDRVIPs = append(d.CIDRVIPs, CIDRDump{Network: c.Network, CIDR: c.Prefix.String()})
	}
	for _, w := range s.WeightedWaypoints() {
		d.WeightedWaypoints = append(d.WeightedWaypoints, WeightedWaypointDump{Destination: *dumpGateway(&w.Destination), Weight: w.Weight})
	}
	if s.IPFamilies != state.IPFamiliesAutomatic {
		d.IPFamilies = s.IPFamilies.String()
	}
	if lb := s.LoadBalancer(); lb != nil {
		d.LoadBalancer = &LoadBalancerDump{RoutingPreferences: []string{}, Mode: lb.Mode.String(), HealthPolicy: lb.HealthPolicy.String()}
		for _, p := range lb.RoutingPreferences {
			d.LoadBalancer.RoutingPreferences = append(d.LoadBalancer.RoutingPreferences, p.String())
		}
	}
	d.VIPs = make([]string, 0, len(s.VIPs))
	for _, v := range s.VIPs {
		d.VIPs = append(d.VIPs, v.String())
	}
	for _, ep := range snap.Endpoints(s) {
		d.Endpoints[ep.Workload.UID] = EndpointDump{WorkloadUID: ep.Workload.UID, Port: portMap(ep.Ports().Map()), Status: ep.Workload.Status.String()}
	}
	return d
}

func dumpStrings(ms []state.StringMatch) []map[string]any {
	var out []map[string]any
	for _, m := range ms {
		if m.Kind == state.MatchPresence {
			out = append(out, map[string]any{"Presence": []any{}})
			continue
		}
		out = append(out, map[string]any{m.Kind.String(): m.Value})
	}
	return out
}

func dumpSAs(ms []state.ServiceAccountMatch) []SADump {
	var out []SADump
	for _, m := range ms {
		out = append(out, SADump{Namespace: m.Namespace, ServiceAccount: m.ServiceAccount})
	}
	return out
}

func dumpPrefixes(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func dumpPolicy(p *state.Policy) PolicyDump {
	d := PolicyDump{Name: p.Name, Namespace: p.Namespace, Scope: p.Scope.String(), Action: p.Action.String(), DryRun: p.DryRun}
	d.Rules = make([][][]MatchDump, 0, len(p.Rules))
	for _, rule := range p.Rules {
		r := make([][]MatchDump, 0, len(rule))
		for _, clause := range rule {
			c := make([]MatchDump, 0, len(clause))
			for _, m := range clause {
				c = append(c, MatchDump{
					Namespaces: dumpStrings(m.Namespaces), NotNamespaces: dumpStrings(m.NotNamespaces),
					Principals: dumpStrings(m.Principals), NotPrincipals: dumpStrings(m.NotPrincipals),
					ServiceAccounts: dumpSAs(m.ServiceAccounts), NotServiceAccounts: dumpSAs(m.NotServiceAccounts),
					SourceIPs: dumpPrefixes(m.SourceIPs), NotSourceIPs: dumpPrefixes(m.NotSourceIPs),
					DestinationIPs: dumpPrefixes(m.DestinationIPs), NotDestinationIPs: dumpPrefixes(m.NotDestinationIPs),
					DestinationPorts: m.DestinationPorts, NotDestinationPorts: m.NotDestinationPorts,
				})
			}
			r = append(r, c)
		}
		d.Rules = append(d.Rules, r)
	}
	return d
}

// dumpCert is one identity's entry of "certificates", as ztunnel's
// dump_certs writes it: the state, and the chain and roots only when
// Available.
func dumpCert(st mtls.CertState) CertsDump {
	d := CertsDump{Identity: st.Identity.String(), State: st.State(), CertChain: []CertDump{}, RootCerts: []CertDump{}}
	c := st.Cert
	if c == nil {
		return d
	}
	for _, der := range c.Certificate.Certificate {
		d.CertChain = append(d.CertChain, certDump(der))
	}
	rest := c.RootsPEM
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		d.RootCerts = append(d.RootCerts, certDump(b.Bytes))
	}
	return d
}
