package state

import (
	"errors"
	"strings"
)

// Delta is a change to a snapshot's workloads, services and policies, as a
// delta xDS push brings it: values to add or to put in place of the value
// with the same key, and keys to remove. Workloads are keyed by UID,
// services by "namespace/hostname" and policies by "namespace/name".
type Delta struct {
	Workloads        []*Workload
	RemovedWorkloads []string
	Services         []*Service
	RemovedServices  []string
	Policies         []*Policy
	RemovedPolicies  []string
}

// size returns the number of workload and service changes.
func (d *Delta) size() int {
	return len(d.Workloads) + len(d.RemovedWorkloads) + len(d.Services) + len(d.RemovedServices)
}

// Rebuild thresholds: a delta changing more than rebuildMin workloads and
// services, and more than 1/rebuildFraction of those the snapshot holds, is
// applied by building the result from scratch, which is then cheaper than
// editing entry by entry (a first push onto an empty snapshot, say). Tests
// change them to run both paths.
var (
	rebuildMin      = 256
	rebuildFraction = 4
)

// Apply returns the snapshot of s's workloads, services and policies changed
// by d: removals first, so that a key both removed and given ends up with
// the given value; removing a key s lacks does nothing. The result is the
// snapshot NewSnapshot would build from the resulting sets (every lookup
// answers the same), validated alike, and Apply fails when NewSnapshot would
// (two workloads on one address, a duplicate key within d, a malformed
// value), leaving s as it is. It takes ownership of d's values, as
// NewSnapshot does.
//
// Its cost follows the size of d, not of s: the new snapshot shares every
// index shard d does not touch with s, and copies the lists d changes (a
// service's endpoints, for one). Without policies in d, the new snapshot
// shares s's compiled policy table and PolicyGeneration, as WithWorkloads
// does; a policy change compiles only the policies d brings and regroups
// their scopes (policyTable.with). Workloads,
// Services and Warnings of the result are computed on their first call.
func (s *Snapshot) Apply(d Delta) (*Snapshot, error) {
	if d.size() == 0 && len(d.Policies) == 0 && len(d.RemovedPolicies) == 0 {
		return s, nil
	}
	if err := checkDeltaKeys(&d); err != nil {
		return nil, err
	}
	if n := d.size(); n > rebuildMin && n > (s.byUID.n+s.svcByKey.n)/rebuildFraction {
		return s.rebuild(&d)
	}
	ns := &Snapshot{
		byUID: s.byUID, byAddr: s.byAddr, byInfo: s.byInfo, byInfoMulti: s.byInfoMulti, byHost: s.byHost,
		svcByKey: s.svcByKey, svcByVIP: s.svcByVIP, svcByVIPMany: s.svcByVIPMany,
		svcByHost: s.svcByHost, svcByHostMany: s.svcByHostMany, cidrVIPs: s.cidrVIPs,
		svcEps: s.svcEps, nets: s.nets,
	}
	b := newBuilder(ns, false, 0, 0)

	for _, key := range d.RemovedServices {
		if nh, ok := parseServiceKey(key); ok {
			if old := serviceByKey(b.svcByKey.m, nh); old != nil {
				b.unindexService(old)
			}
		}
	}
	for _, svc := range d.Services {
		if old := serviceByKey(b.svcByKey.m, NamespacedHostname{svc.Namespace, svc.Hostname}); old != nil {
			b.unindexService(old)
		}
		b.checkService(svc)
		b.indexService(svc)
	}

	// Every old version leaves before a new one claims its addresses, so
	// that two workloads may swap addresses in one delta.
	for _, uid := range d.RemovedWorkloads {
		if old := workloadByUID(b.byUID.m, uid); old != nil {
			b.unindexWorkload(old)
		}
	}
	wls := sortedWorkloads(d.Workloads)
	for _, w := range wls {
		if old := workloadByUID(b.byUID.m, w.UID); old != nil {
			b.unindexWorkload(old)
		}
	}
	for _, w := range wls {
		b.setUID(w)
	}
	for _, w := range wls {
		b.checkWorkload(w)
		b.indexWorkload(w)
	}
	return b.done(s.nextPolicies(b, &d))
}

// rebuild applies d by building the resulting sets from scratch.
func (s *Snapshot) rebuild(d *Delta) (*Snapshot, error) {
	gone := make(map[string]struct{}, len(d.RemovedWorkloads)+len(d.Workloads))
	for _, uid := range d.RemovedWorkloads {
		gone[uid] = struct{}{}
	}
	for _, w := range d.Workloads {
		gone[w.UID] = struct{}{}
	}
	workloads := make([]*Workload, 0, s.byUID.n+len(d.Workloads))
	s.byUID.all(func(_ hashed, w *Workload) {
		if _, g := gone[w.UID]; !g {
			workloads = append(workloads, w)
		}
	})
	workloads = append(workloads, d.Workloads...)

	goneSvc := make(map[NamespacedHostname]struct{}, len(d.RemovedServices)+len(d.Services))
	for _, key := range d.RemovedServices {
		if nh, ok := parseServiceKey(key); ok {
			goneSvc[nh] = struct{}{}
		}
	}
	for _, svc := range d.Services {
		goneSvc[NamespacedHostname{svc.Namespace, svc.Hostname}] = struct{}{}
	}
	services := make([]*Service, 0, s.svcByKey.n+len(d.Services))
	s.svcByKey.all(func(_ hashed, svc *Service) {
		if _, g := goneSvc[NamespacedHostname{svc.Namespace, svc.Hostname}]; !g {
			services = append(services, svc)
		}
	})
	services = append(services, d.Services...)

	b := buildFresh(workloads, services)
	return b.done(s.nextPolicies(b, d))
}

// checkDeltaKeys rejects what cannot be keyed in d: nil values, empty keys,
// and a key given twice.
func checkDeltaKeys(d *Delta) error {
	b := &builder{}
	uids := make(map[string]struct{}, len(d.Workloads))
	for i, w := range d.Workloads {
		if !b.checkWorkloadKey(i, w) {
			continue
		}
		if _, dup := uids[w.UID]; dup {
			b.fail("workload %q: duplicate uid", w.UID)
		}
		uids[w.UID] = struct{}{}
	}
	keys := make(map[NamespacedHostname]struct{}, len(d.Services))
	for i, svc := range d.Services {
		if !b.checkServiceKey(i, svc) {
			continue
		}
		key := NamespacedHostname{svc.Namespace, svc.Hostname}
		if _, dup := keys[key]; dup {
			b.fail("%s: duplicate service key", subject{"service", key.String()})
		}
		keys[key] = struct{}{}
	}
	if len(b.errs) > 0 {
		return errors.Join(b.errs...)
	}
	return nil
}

// nextPolicies returns the policy table of s's policies changed by d: s's
// own table when d changes none, else one derived from it that compiles
// only the policies d brings (policyTable.with). Errors are recorded on b.
func (s *Snapshot) nextPolicies(b *builder, d *Delta) *policyTable {
	if len(d.Policies) == 0 && len(d.RemovedPolicies) == 0 {
		return s.pol
	}
	valid := b.checkPolicies(d.Policies)
	if len(b.errs) > 0 {
		return nil
	}
	return s.pol.with(valid, d.RemovedPolicies)
}

// sortedWorkloads returns the workloads sorted by UID, in a new slice.
func sortedWorkloads(ws []*Workload) []*Workload {
	out := make([]*Workload, len(ws))
	copy(out, ws)
	sortByKey(out, func(w *Workload) string { return w.UID })
	return out
}

// parseServiceKey splits a "namespace/hostname" key.
func parseServiceKey(key string) (NamespacedHostname, bool) {
	ns, host, ok := strings.Cut(key, "/")
	return NamespacedHostname{ns, host}, ok
}
