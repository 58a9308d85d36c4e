package dnsproxy

import (
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel/state"
)

// view is one request's view of the mesh: the snapshot, who asks, and the
// names derived from the cluster domain. It lives for one request.
type view struct {
	snap      *state.Snapshot
	ns        string // the client's namespace
	network   string // the client's network: VIPs of other networks are not answered
	domain    string // cluster domain, e.g. "cluster.local"
	svcDomain string // "svc." + domain
	search    []string
	preferNS  string
}

// alias is one name the question may stand for.
type alias struct {
	name string // lower case, no trailing dot
	// stripped is set when name was derived from the question with a search
	// domain removed: the question minus that domain (what the CNAME points to).
	stripped string
}

// match is what a question resolved to: a service, or one workload (the pod
// of a pod.subdomain name).
type match struct {
	name  string // the matched hostname, possibly a wildcard ("*.example.com")
	alias alias
	svc   *state.Service
	wl    *state.Workload
}

// find resolves a question name (lower case, no trailing dot).
func (v *view) find(q string) (match, bool) {
	if q == "" {
		return match{}, false
	}
	for _, a := range v.aliases(q) {
		for _, cand := range wildcards(a.name) {
			if svc := v.bestService(cand); svc != nil {
				return match{name: cand, alias: a, svc: svc}, true
			}
		}
		if w := v.podHost(a.name); w != nil {
			return match{name: a.name, alias: a, wl: w}, true
		}
	}
	return match{}, false
}

// aliases lists, without repeats and in the order they are tried: the
// question, its Kubernetes expansions, then for each search domain it ends
// with, the question without it and that name's expansions.
func (v *view) aliases(q string) []alias {
	out := make([]alias, 0, 8)
	add := func(a alias) {
		for _, o := range out {
			if o.name == a.name {
				return
			}
		}
		out = append(out, a)
	}
	add(alias{name: q})
	for _, n := range v.kubeNames(q) {
		add(alias{name: n})
	}
	for _, sd := range v.search {
		s, ok := trimDomain(q, sd)
		if !ok {
			continue
		}
		add(alias{name: s, stripped: s})
		for _, n := range v.kubeNames(s) {
			add(alias{name: n, stripped: s})
		}
	}
	return out
}

// kubeNames expands a short name to the Kubernetes FQDNs it may mean for a
// client in v.ns:
//
//	svc          -> svc.<ns>.svc.<domain>
//	svc.ns       -> svc.ns.svc.<domain>, and pod.sub -> pod.sub.<ns>.svc.<domain>
//	svc.ns.svc   -> svc.ns.svc.<domain>
//	pod.sub.ns   -> pod.sub.ns.svc.<domain>
//	pod.sub.ns.svc -> pod.sub.ns.svc.<domain>
//
// Longer names are taken as already qualified.
func (v *view) kubeNames(name string) []string {
	n := strings.Count(name, ".") + 1
	svcLast := strings.HasSuffix(name, ".svc")
	switch {
	case n == 1:
		return []string{name + "." + v.ns + "." + v.svcDomain}
	case n == 2:
		return []string{name + "." + v.svcDomain, name + "." + v.ns + "." + v.svcDomain}
	case n == 3 && svcLast:
		return []string{name + "." + v.domain, name + "." + v.svcDomain}
	case n == 3:
		return []string{name + "." + v.svcDomain}
	case n == 4 && svcLast:
		return []string{name + "." + v.domain}
	}
	return nil
}

// trimDomain returns name without the trailing domain d, if name is longer
// than d and ends with it on a label boundary.
func trimDomain(name, d string) (string, bool) {
	if d == "" || len(name) <= len(d)+1 || !strings.HasSuffix(name, d) || name[len(name)-len(d)-1] != '.' {
		return "", false
	}
	return name[:len(name)-len(d)-1], true
}

// wildcards returns name followed by its wildcards from the most specific:
// a.b.c -> a.b.c, *.b.c, *.c.
func wildcards(name string) []string {
	out := []string{name}
	for rest := name; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return out
		}
		rest = rest[i+1:]
		out = append(out, "*."+rest)
	}
}

// bestService returns the service with hostname host that answers for the
// client: visible to its namespace and either with VIPs or a Kubernetes
// headless service. The client's namespace wins, then a canonical service,
// then the preferred namespace, then the first by key.
func (v *view) bestService(host string) *state.Service {
	return v.snap.ServiceByHostnameWhere(host, v.ns, v.preferNS, func(svc *state.Service) bool {
		return len(svc.VIPs) > 0 || v.kubeHeadless(svc)
	})
}

// kubeHeadless reports whether svc is a Kubernetes headless service: no VIP
// and a hostname under svc.<domain>. Other VIP-less services (a
// ServiceEntry with DNS resolution) are left to the upstream resolvers.
func (v *view) kubeHeadless(svc *state.Service) bool {
	return len(svc.VIPs) == 0 && strings.HasSuffix(svc.Hostname, "."+v.svcDomain)
}

// podHost resolves <pod>.<service>.<ns>.svc.<domain>, the name a pod gets
// behind a headless service (a StatefulSet's pods): the endpoint of that
// headless service whose workload is named <pod>.
func (v *view) podHost(name string) *state.Workload {
	prefix, ok := trimDomain(name, v.svcDomain)
	if !ok || strings.Count(prefix, ".") != 2 {
		return nil
	}
	pod, svcNS, _ := strings.Cut(prefix, ".") // svcNS is "<service>.<ns>"
	svc := v.bestService(svcNS + "." + v.svcDomain)
	if svc == nil || !v.kubeHeadless(svc) {
		return nil
	}
	for _, ep := range v.snap.Endpoints(svc) {
		if ep.Workload.Name == pod {
			return ep.Workload
		}
	}
	return nil
}

// familyAllowed reports whether m can have records of the asked family: a
// single-stack service has none of the other family even when its
// endpoints (headless) are dual stack.
func familyAllowed(m match, v6 bool) bool {
	if m.svc == nil {
		return true
	}
	switch m.svc.IPFamilies {
	case state.IPFamiliesIPv4:
		return !v6
	case state.IPFamiliesIPv6:
		return v6
	}
	return true
}

// addresses returns m's addresses of the asked family: a workload's own, a
// service's VIPs on the client's network, or a headless service's endpoint
// addresses (the first of the family per endpoint).
func (v *view) addresses(m match, v6 bool) []netip.Addr {
	if !familyAllowed(m, v6) {
		return nil
	}
	is := func(a netip.Addr) bool { a = a.Unmap(); return a.Is6() == v6 }
	var out []netip.Addr
	switch {
	case m.wl != nil:
		for _, a := range m.wl.Addresses {
			if is(a) {
				out = append(out, a.Unmap())
			}
		}
	case len(m.svc.VIPs) > 0:
		for _, vip := range m.svc.VIPs {
			if vip.Network == v.network && is(vip.Addr) {
				out = append(out, vip.Addr.Unmap())
			}
		}
	default:
		for _, ep := range v.snap.Endpoints(m.svc) {
			for _, a := range ep.Workload.Addresses {
				if is(a) {
					out = append(out, a.Unmap())
					break
				}
			}
		}
	}
	return out
}

// lowerASCII lower-cases ASCII letters only, so the result has the same
// length as s (names may carry escaped or non-ASCII bytes).
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
