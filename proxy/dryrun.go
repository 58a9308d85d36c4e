package proxy

import (
	"context"
	"log/slog"

	"github.com/ztunnel-go/ztunnel/state"
)

// logDryRun logs what the dry-run policies (istio.io/dry-run) would have
// decided for c, as ztunnel's assert_rbac does, and never changes the
// decision: each matching dry-run DENY ("dry-run: deny policy match") and
// ALLOW ("dry-run: allow policy match") by key, and "dry-run: no allow
// policies match" when enforcing the dry-run ALLOW policies would deny c.
// The level is debug, or info with Config.PolicyInfoLogging
// (AUTHZ_POLICY_INFO_LOGGING), under scope "state" (ztunnel::state). It
// costs nothing when no dry-run policy applies.
func (p *Proxy) logDryRun(snap *state.Snapshot, c state.Conn) {
	matches := snap.DryRunMatches(c)
	wouldDeny := snap.DryRunWouldDeny(c, matches)
	if len(matches) == 0 && !wouldDeny {
		return
	}
	level := slog.LevelDebug
	if p.cfg.PolicyInfoLogging {
		level = slog.LevelInfo
	}
	log := p.log.With("scope", "state")
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	conn := []any{"src.addr", c.Src.String(), "dst.addr", c.Dst.String()}
	if !c.SrcIdentity.IsZero() {
		conn = append(conn, "src.identity", c.SrcIdentity.String())
	}
	for _, pol := range matches {
		msg := "dry-run: allow policy match"
		if pol.Action == state.ActionDeny {
			msg = "dry-run: deny policy match"
		}
		log.Log(ctx, level, msg, append([]any{"policy", pol.Key()}, conn...)...)
	}
	if wouldDeny {
		log.Log(ctx, level, "dry-run: no allow policies match", conn...)
	}
}
