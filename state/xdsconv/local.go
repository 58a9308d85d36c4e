package xdsconv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ztunnel-go/ztunnel/state"
)

// LocalConfig is a parsed ztunnel local config (LOCAL_XDS_PATH / LOCAL_XDS):
// the values of its three lists, already converted to state types. Its
// fields may be edited before Snapshot is called; after that they belong to
// the snapshot.
type LocalConfig struct {
	Workloads []*state.Workload
	Services  []*state.Service
	Policies  []*state.Policy
}

// LocalSnapshot parses a local config and builds its snapshot.
func LocalSnapshot(data []byte) (*state.Snapshot, error) {
	c, err := ParseLocalConfig(data)
	if err != nil {
		return nil, err
	}
	return c.Snapshot()
}

// Snapshot validates the config as a whole (duplicate UIDs, keys and
// addresses, ...) and builds the snapshot.
func (c *LocalConfig) Snapshot() (*state.Snapshot, error) {
	s, err := state.NewSnapshot(c.Workloads, c.Services, c.Policies)
	if err != nil {
		return nil, fmt.Errorf("local config: %w", err)
	}
	return s, nil
}

// ParseLocalConfig parses ztunnel's local config YAML: top-level lists
// workloads, policies and services with ztunnel's camelCase field names.
//
// The schema is ztunnel's (src/xds.rs LocalConfig and the serde attributes of
// its Workload, Service and Authorization types), with these differences:
//
//   - Unknown fields are rejected everywhere, including inside policy
//     matches and locality, where ztunnel ignores them: a misspelt match
//     field would otherwise silently turn a policy into deny-all or no-op.
//   - A workload needs a uid (ztunnel defaults it to "", and two workloads
//     without one would silently replace each other).
//   - A null value counts as an absent field, and an empty document is an
//     empty config.
//   - Policy source/destination addresses may be bare IPs as well as CIDRs.
//   - Endpoints listed inline under a service ({uid: {workloadUid, port,
//     status}}) are folded into their workloads' services maps unless the
//     workload lists the service itself; their status is ignored in favour
//     of the workload's.
//
// Errors are *ConfigError values naming the line and the field.
func ParseLocalConfig(data []byte) (*LocalConfig, error) {
	cfg := &LocalConfig{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, nil
		}
		return nil, fmt.Errorf("local config: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("local config: %w", err)
		}
		return nil, &ConfigError{Line: extra.Line, Msg: "more than one YAML document"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &ConfigError{Line: doc.Line, Msg: "expected one YAML document"}
	}
	root := doc.Content[0]
	if isNull(root) {
		return cfg, nil
	}
	d := &decoder{budget: nodeBudget(len(data))}
	var inline []inlineEndpoint
	err := d.object(root, "", "local config", map[string]fieldFunc{
		"workloads": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				w, err := d.workload(n, path)
				cfg.Workloads = append(cfg.Workloads, w)
				return err
			})
		},
		"services": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				s, eps, err := d.service(n, path)
				cfg.Services = append(cfg.Services, s)
				inline = append(inline, eps...)
				return err
			})
		},
		"policies": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				p, err := d.policy(n, path)
				cfg.Policies = append(cfg.Policies, p)
				return err
			})
		},
	})
	if err != nil {
		return nil, err
	}
	foldEndpoints(cfg.Workloads, inline)
	return cfg, nil
}

// inlineEndpoint is an endpoint written under a service rather than under
// its workload.
type inlineEndpoint struct {
	service, workloadUID string
	ports                map[uint16]uint16
}

func foldEndpoints(workloads []*state.Workload, eps []inlineEndpoint) {
	if len(eps) == 0 {
		return
	}
	byUID := make(map[string]*state.Workload, len(workloads))
	for _, w := range workloads {
		byUID[w.UID] = w
	}
	for _, ep := range eps {
		w := byUID[ep.workloadUID]
		if w == nil {
			continue // ztunnel keeps it but never routes to it
		}
		if w.Services.Has(ep.service) {
			continue // the workload's own entry wins, as in ztunnel
		}
		m := w.Services.Map()
		m[ep.service] = maps.Clone(ep.ports)
		w.Services = state.ServicesOf(m)
	}
}

func (d *decoder) workload(n *yaml.Node, path string) (*state.Workload, error) {
	w := &state.Workload{Capacity: 1}
	var (
		x      state.WorkloadExtra  // w.Extra, when not empty
		labels state.WorkloadLabels // w.Labels, likewise
		place  state.Placement      // w.Place, likewise
		svcs   = map[string]map[uint16]uint16{}
	)
	err := d.object(n, path, "workload", map[string]fieldFunc{
		"uid":               str(&w.UID),
		"name":              str(&w.Name),
		"namespace":         str(&labels.Namespace),
		"serviceAccount":    str(&labels.ServiceAccount),
		"trustDomain":       str(&labels.TrustDomain),
		"network":           str(&labels.Network),
		"node":              str(&place.Node),
		"clusterId":         str(&labels.ClusterID),
		"workloadName":      str(&labels.WorkloadName),
		"workloadType":      str(&labels.WorkloadType),
		"canonicalName":     str(&labels.CanonicalName),
		"canonicalRevision": str(&labels.CanonicalRevision),
		"hostname":          str(&x.Hostname),
		"workloadIps":       ipList(&w.Addresses),
		"protocol":          enum(&w.Protocol, "protocol", "TCP", "HBONE"),
		"status":            enum(&w.Status, "status", "Healthy", "Unhealthy"),
		"networkMode":       enum(&w.NetworkMode, "network mode", "Standard", "HostNetwork"),
		"waypoint":          gateway(&x.Waypoint),
		"networkGateway":    gateway(&x.NetworkGateway),
		"nativeTunnel":      boolean(&w.NativeTunnel),
		"applicationTunnel": func(d *decoder, n *yaml.Node, path string) error {
			t := &state.ApplicationTunnel{}
			x.ApplicationTunnel = t
			return d.object(n, path, "application tunnel", map[string]fieldFunc{
				"protocol": enum(&t.Protocol, "application tunnel protocol", "NONE", "PROXY"),
				"port":     u16(&t.Port, "port"),
			}, "protocol")
		},
		"authorizationPolicies": strList(&x.AuthorizationPolicies),
		"capacity":              u32(&w.Capacity, "capacity"),
		"locality": func(d *decoder, n *yaml.Node, path string) error {
			l := &place.Locality
			return d.object(n, path, "locality", map[string]fieldFunc{
				"region":  str(&l.Region),
				"zone":    str(&l.Zone),
				"subzone": str(&l.Subzone),
			}, "region", "zone", "subzone")
		},
		"services": func(d *decoder, n *yaml.Node, path string) error {
			return d.mapping(n, path, func(k, v *yaml.Node, path string) error {
				if !strings.Contains(k.Value, "/") {
					return errAt(k, path, "service key %q is not namespace/hostname", k.Value)
				}
				var ports map[uint16]uint16
				err := portMap(&ports)(d, v, path)
				svcs[k.Value] = ports
				return err
			})
		},
	}, "uid", "namespace", "workloadIps", "services")
	w.SetExtra(x)
	w.Labels = internLabels(labels)
	w.Place = internPlace(place)
	w.Services = state.ServicesOf(svcs)
	return w, err
}

func (d *decoder) service(n *yaml.Node, path string) (*state.Service, []inlineEndpoint, error) {
	s := &state.Service{Ports: map[uint16]uint16{}}
	var (
		eps []inlineEndpoint
		x   state.ServiceExtra // s.Extra, when not empty
	)
	err := d.object(n, path, "service", map[string]fieldFunc{
		"name":      str(&s.Name),
		"namespace": str(&s.Namespace),
		"hostname":  str(&s.Hostname),
		"vips": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				a, err := networkAddress(n, path)
				s.VIPs = append(s.VIPs, a)
				return err
			})
		},
		"cidrVips": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				var c state.NetworkPrefix
				err := d.object(n, path, "network CIDR", map[string]fieldFunc{
					"network": str(&c.Network),
					"cidr": func(_ *decoder, n *yaml.Node, path string) (err error) {
						c.Prefix, err = parsePrefix(n, path)
						return err
					},
				}, "network", "cidr")
				x.CIDRVIPs = append(x.CIDRVIPs, c)
				return err
			})
		},
		"ports":           portMap(&s.Ports),
		"subjectAltNames": strList(&x.SubjectAltNames),
		"waypoint":        gateway(&s.Waypoint),
		"weightedWaypoints": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				var ww state.WeightedWaypoint
				var dst *state.GatewayAddress
				err := d.object(n, path, "weighted waypoint", map[string]fieldFunc{
					"destination": gateway(&dst),
					"weight":      u32(&ww.Weight, "weight"),
				}, "destination", "weight")
				if dst != nil {
					ww.Destination = *dst
				}
				x.WeightedWaypoints = append(x.WeightedWaypoints, ww)
				return err
			})
		},
		"loadBalancer": func(d *decoder, n *yaml.Node, path string) error {
			lb := &state.LoadBalancer{}
			x.LoadBalancer = lb
			return d.object(n, path, "load balancer", map[string]fieldFunc{
				"routingPreferences": func(d *decoder, n *yaml.Node, path string) error {
					lb.RoutingPreferences = []state.LBScope{}
					return d.list(n, path, func(n *yaml.Node, path string) error {
						var sc state.LBScope
						err := enum(&sc, "routing preference", "Region", "Zone", "Subzone", "Node", "Cluster", "Network")(d, n, path)
						lb.RoutingPreferences = append(lb.RoutingPreferences, sc)
						return err
					})
				},
				"mode":         enum(&lb.Mode, "load balancer mode", "Standard", "Strict", "Failover", "Passthrough"),
				"healthPolicy": enum(&lb.HealthPolicy, "health policy", "OnlyHealthy", "AllowAll"),
			}, "routingPreferences", "mode", "healthPolicy")
		},
		"ipFamilies": enum(&s.IPFamilies, "ip families", "", "IPv4", "IPv6", "Dual"),
		"canonical":  boolean(&s.Canonical),
		"visibility": enum(&s.Visibility, "visibility", "Public", "Namespace"),
		"endpoints": func(d *decoder, n *yaml.Node, path string) error {
			return d.mapping(n, path, func(_, v *yaml.Node, path string) error {
				var ep inlineEndpoint
				var status state.HealthStatus
				err := d.object(v, path, "endpoint", map[string]fieldFunc{
					"workloadUid": str(&ep.workloadUID),
					"port":        portMap(&ep.ports),
					"status":      enum(&status, "status", "Healthy", "Unhealthy"),
				}, "workloadUid", "port", "status")
				eps = append(eps, ep)
				return err
			})
		},
	}, "name", "namespace", "hostname", "vips", "ports")
	s.SetExtra(x)
	for i := range eps {
		eps[i].service = s.Key()
	}
	return s, eps, err
}

// networkAddress reads "network/ip" (the network may be empty: "/10.0.0.1").
func networkAddress(n *yaml.Node, path string) (state.NetworkAddress, error) {
	s, err := scalar(n, path, "a network/IP address")
	if err != nil {
		return state.NetworkAddress{}, err
	}
	network, ip, ok := strings.Cut(s, "/")
	addr, err := netip.ParseAddr(ip)
	if !ok || err != nil || addr.Zone() != "" {
		return state.NetworkAddress{}, errAt(n, path, "invalid network address %q: want network/IP, e.g. \"/10.0.0.1\"", s)
	}
	return state.NetworkAddress{Network: network, Addr: addr}, nil
}

// gateway reads ztunnel's GatewayAddress: {destination, hboneMtlsPort}, where
// destination is "network/ip" if it parses as one, else "namespace/hostname".
func gateway(dst **state.GatewayAddress) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		g := &state.GatewayAddress{}
		*dst = g
		return d.object(n, path, "gateway address", map[string]fieldFunc{
			"destination": func(_ *decoder, n *yaml.Node, path string) error {
				s, err := scalar(n, path, "network/IP or namespace/hostname")
				if err != nil {
					return err
				}
				if a, err := networkAddress(n, path); err == nil {
					g.Address = &a
					return nil
				}
				ns, host, ok := strings.Cut(s, "/")
				if !ok {
					return errAt(n, path, "invalid destination %q: want network/IP or namespace/hostname", s)
				}
				g.Hostname = &state.NamespacedHostname{Namespace: ns, Hostname: host}
				return nil
			},
			"hboneMtlsPort": u16(&g.HBONEMTLSPort, "port"),
		}, "destination", "hboneMtlsPort")
	}
}

func (d *decoder) policy(n *yaml.Node, path string) (*state.Policy, error) {
	p := &state.Policy{Rules: [][][]state.Match{}}
	err := d.object(n, path, "policy", map[string]fieldFunc{
		"name":      str(&p.Name),
		"namespace": str(&p.Namespace),
		"scope":     enum(&p.Scope, "scope", "Global", "Namespace", "WorkloadSelector"),
		"action":    enum(&p.Action, "action", "Allow", "Deny"),
		"dryRun":    boolean(&p.DryRun),
		"rules": func(d *decoder, n *yaml.Node, path string) error {
			return d.list(n, path, func(n *yaml.Node, path string) error {
				rule := [][]state.Match{}
				err := d.list(n, path, func(n *yaml.Node, path string) error {
					clause := []state.Match{}
					err := d.list(n, path, func(n *yaml.Node, path string) error {
						m, err := d.match(n, path)
						clause = append(clause, m)
						return err
					})
					rule = append(rule, clause)
					return err
				})
				p.Rules = append(p.Rules, rule)
				return err
			})
		},
	}, "name", "namespace", "scope", "action", "rules", "dryRun")
	return p, err
}

func (d *decoder) match(n *yaml.Node, path string) (state.Match, error) {
	var m state.Match
	err := d.object(n, path, "match", map[string]fieldFunc{
		"namespaces":          stringMatches(&m.Namespaces),
		"notNamespaces":       stringMatches(&m.NotNamespaces),
		"principals":          stringMatches(&m.Principals),
		"notPrincipals":       stringMatches(&m.NotPrincipals),
		"serviceAccounts":     serviceAccounts(&m.ServiceAccounts),
		"notServiceAccounts":  serviceAccounts(&m.NotServiceAccounts),
		"sourceIps":           prefixList(&m.SourceIPs),
		"notSourceIps":        prefixList(&m.NotSourceIPs),
		"destinationIps":      prefixList(&m.DestinationIPs),
		"notDestinationIps":   prefixList(&m.NotDestinationIPs),
		"destinationPorts":    portList(&m.DestinationPorts),
		"notDestinationPorts": portList(&m.NotDestinationPorts),
	})
	return m, err
}

func serviceAccounts(dst *[]state.ServiceAccountMatch) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		return d.list(n, path, func(n *yaml.Node, path string) error {
			var sa state.ServiceAccountMatch
			err := d.object(n, path, "service account match", map[string]fieldFunc{
				"namespace":      str(&sa.Namespace),
				"serviceAccount": str(&sa.ServiceAccount),
			}, "namespace", "serviceAccount")
			*dst = append(*dst, sa)
			return err
		})
	}
}

// matchKinds are ztunnel's StringMatch variant names, in state.MatchKind order.
var matchKinds = []string{"Exact", "Prefix", "Suffix", "Presence"}

// stringMatches reads StringMatch values the way serde writes Rust enums:
// {Exact: "x"}, {Prefix: "x"}, {Suffix: "x"}, {Presence: []}, or with YAML
// tags: !Exact x, !Presence []. Presence also accepts null and {}.
func stringMatches(dst *[]state.StringMatch) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		return d.list(n, path, func(n *yaml.Node, path string) error {
			var variant string
			var value *yaml.Node
			switch {
			case strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!"):
				variant, value = n.Tag[1:], n
			case n.Kind == yaml.MappingNode && len(n.Content) == 2:
				k, err := d.resolve(n.Content[0], path)
				if err != nil {
					return err
				}
				if value, err = d.resolve(n.Content[1], path); err != nil {
					return err
				}
				variant = k.Value
			default:
				return errAt(n, path, "expected a string match such as {Exact: value}, got %s", kindName(n))
			}
			kind, err := enumValue(&yaml.Node{Kind: yaml.ScalarNode, Value: variant, Line: n.Line, Column: n.Column}, path, "string match", matchKinds)
			if err != nil {
				return err
			}
			sm := state.StringMatch{Kind: state.MatchKind(kind)}
			if sm.Kind == state.MatchPresence {
				empty := isNull(value) || (value.Kind != yaml.ScalarNode && len(value.Content) == 0) ||
					(value.Kind == yaml.ScalarNode && value.Value == "" && value == n) // !Presence with no value
				if !empty {
					return errAt(value, path, "Presence takes no value, got %s", kindName(value))
				}
			} else if sm.Value, err = scalar(value, path, "a string"); err != nil {
				return err
			}
			*dst = append(*dst, sm)
			return nil
		})
	}
}
