package istiolab

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// Service VIPs as kube-proxy (iptables mode) programs them, in each node's
// network namespace, from the API server's Services and EndpointSlices: a
// pod's connection to a ClusterIP and port is DNATed on its node to one of
// the Service's ready endpoints, chosen at random, before the node routes
// it. A mesh pod's connections never get there (istio-cni's rules in the
// pod hand them to the node's daemon, which resolves the VIP itself); the
// rules are for pods outside the mesh, and for kubernetes.default (10.96.0.1,
// whose EndpointSlice the API server keeps pointing at itself).

// The nat table's chains the lab owns in a node's namespace.
const (
	servicesChain    = "ISTIOLAB-SERVICES"
	postroutingChain = "ISTIOLAB-POSTROUTING"
	// masqMark marks a connection from one of the Service's own endpoints,
	// which may be sent to itself: kube-proxy's hairpin masquerade, without
	// which the reply would not come back through the DNAT.
	masqMark = "0x4000/0x4000"
)

// apiService is the part of a Service the proxy reads.
type apiService struct {
	Metadata struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		ClusterIP string `json:"clusterIP"`
		Ports     []struct {
			Name     string `json:"name"`
			Protocol string `json:"protocol"`
			Port     int    `json:"port"`
		} `json:"ports"`
	} `json:"spec"`
}

// apiEndpointSlice is the part of an EndpointSlice the proxy reads.
type apiEndpointSlice struct {
	Metadata struct {
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	AddressType string `json:"addressType"`
	Endpoints   []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready *bool `json:"ready"`
		} `json:"conditions"`
	} `json:"endpoints"`
	Ports []struct {
		Name     *string `json:"name"`
		Protocol string  `json:"protocol"`
		Port     *int    `json:"port"`
	} `json:"ports"`
}

// serviceRules lists Services and EndpointSlices and renders the
// iptables-restore input that programs them: the lab's chains declared
// (which flushes them), one DNAT rule per ready endpoint of each ClusterIP
// port, each taking its share of what the rules before it left (kube-proxy's
// random balancing), and the hairpin masquerade.
func (cp *ControlPlane) serviceRules(ctx context.Context) ([]byte, error) {
	var services struct {
		Items []apiService `json:"items"`
	}
	if err := cp.api.do(ctx, http.MethodGet, "/api/v1/services", nil, &services); err != nil {
		return nil, err
	}
	var slicesList struct {
		Items []apiEndpointSlice `json:"items"`
	}
	if err := cp.api.do(ctx, http.MethodGet, "/apis/discovery.k8s.io/v1/endpointslices", nil, &slicesList); err != nil {
		return nil, err
	}
	// Each Service's slices, by namespace/name.
	bySvc := make(map[string][]apiEndpointSlice)
	for _, s := range slicesList.Items {
		if svc := s.Metadata.Labels["kubernetes.io/service-name"]; svc != "" && s.AddressType == "IPv4" {
			key := s.Metadata.Namespace + "/" + svc
			bySvc[key] = append(bySvc[key], s)
		}
	}
	slices.SortFunc(services.Items, func(a, b apiService) int {
		return strings.Compare(a.Metadata.Namespace+"/"+a.Metadata.Name, b.Metadata.Namespace+"/"+b.Metadata.Name)
	})
	var b bytes.Buffer
	b.WriteString("*nat\n:" + servicesChain + " - [0:0]\n:" + postroutingChain + " - [0:0]\n")
	for _, svc := range services.Items {
		vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !vip.Is4() {
			continue // headless ("None"), or no VIP
		}
		key := svc.Metadata.Namespace + "/" + svc.Metadata.Name
		for _, port := range svc.Spec.Ports {
			proto := strings.ToLower(port.Protocol)
			if proto == "" {
				proto = "tcp"
			}
			var targets []netip.AddrPort
			for _, s := range bySvc[key] {
				target := 0
				for _, p := range s.Ports {
					name := ""
					if p.Name != nil {
						name = *p.Name
					}
					if name == port.Name && strings.EqualFold(p.Protocol, port.Protocol) && p.Port != nil {
						target = *p.Port
					}
				}
				if target == 0 {
					continue
				}
				for _, ep := range s.Endpoints {
					if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
						continue
					}
					if addr, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
						targets = append(targets, netip.AddrPortFrom(addr, uint16(target)))
					}
				}
			}
			slices.SortFunc(targets, netip.AddrPort.Compare)
			match := fmt.Sprintf("-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %s",
				servicesChain, vip, proto, proto, port.Port, strconv.Quote(key+":"+port.Name))
			// A connection from an endpoint is marked for masquerade (it
			// may come back to itself), then each endpoint takes its share
			// of what the rules before it left.
			for _, t := range targets {
				fmt.Fprintf(&b, "%s -s %s/32 -j MARK --set-xmark %s\n", match, t.Addr(), masqMark)
			}
			for i, t := range targets {
				share := ""
				if left := len(targets) - i; left > 1 {
					share = fmt.Sprintf(" -m statistic --mode random --probability %.5f", 1/float64(left))
				}
				fmt.Fprintf(&b, "%s%s -j DNAT --to-destination %s\n", match, share, t)
			}
		}
	}
	fmt.Fprintf(&b, "-A %s -m mark --mark %s -j MASQUERADE\nCOMMIT\n", postroutingChain, masqMark)
	return b.Bytes(), nil
}

// programServices loads rules (serviceRules) into node's namespace: the
// lab's chains replaced whole, then hooked into PREROUTING and POSTROUTING
// once. Bridged traffic between a node's pods must pass the node's
// iptables for the replies to be translated back (br_netfilter, which
// kube-proxy needs too).
func programServices(ctx context.Context, node *netnslab.Node, rules []byte) error {
	if err := node.Do(func() error {
		return os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("istiolab: node %s: br_netfilter: %w", node.Name, err)
	}
	cmd := node.Command(ctx, "iptables-restore", "--noflush", "-w")
	cmd.Stdin = bytes.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("istiolab: node %s: iptables-restore: %w: %s", node.Name, err, bytes.TrimSpace(out))
	}
	for _, hook := range [][]string{{"PREROUTING", servicesChain}, {"POSTROUTING", postroutingChain}} {
		if node.Command(ctx, "iptables", "-w", "-t", "nat", "-C", hook[0], "-j", hook[1]).Run() == nil {
			continue
		}
		if out, err := node.Command(ctx, "iptables", "-w", "-t", "nat", "-I", hook[0], "-j", hook[1]).CombinedOutput(); err != nil {
			return fmt.Errorf("istiolab: node %s: hooking %s: %w: %s", node.Name, hook[1], err, bytes.TrimSpace(out))
		}
	}
	return nil
}
