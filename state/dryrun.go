package state

// DryRunWouldDeny reports the last of the dry-run outcomes ztunnel logs
// ("dry-run: no allow policies match"): no enforced ALLOW policy applies to
// c's destination workload, so c is allowed for that reason, while dry-run
// ALLOW policies do apply and none of them matches c, so enforcing them
// would deny it. matches is what DryRunMatches returned for c.
func (s *Snapshot) DryRunWouldDeny(c Conn, matches []*Policy) bool {
	w := c.DstWorkload
	t := s.pol
	if w == nil || t.gen == 0 {
		return false
	}
	for _, p := range matches {
		if p.Action == ActionAllow {
			return false
		}
	}
	nsv := t.nsView(w.Namespace())
	if t.global.hasAllow || nsv != nil && nsv.hasAllow {
		return false
	}
	dryAllow := !t.global.dryAllow.empty() || nsv != nil && !nsv.dryAllow.empty()
	for _, k := range w.AuthorizationPolicies() {
		cp := t.lookup(k)
		if cp == nil || cp.p.Action != ActionAllow {
			continue
		}
		if cp.enforced {
			return false
		}
		dryAllow = true
	}
	return dryAllow
}

// empty reports whether l holds no policy.
func (l *policyList) empty() bool { return len(l.any) == 0 && len(l.byPort) == 0 }
