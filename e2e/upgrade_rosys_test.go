package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
)

// TestSharedUpgradeReadOnlyProcSys is TestSharedUpgrade in the chart's real
// security context: every daemon runs with /proc/sys mounted read-only (a
// mount namespace with a read-only bind of it), so net.ipv4.tcp_migrate_req
// cannot be set in any pod and the old daemon's queued connections could
// not be migrated. The listeners' SO_REUSEPORT steering program (engine)
// sends new connections to the new daemon as soon as it listens, so the old
// one's queue is empty when it closes: no connection attempt may be lost.
func TestSharedUpgradeReadOnlyProcSys(t *testing.T) {
	s := startShared(t, func(o *labrun.SharedOptions) { o.ReadOnlyProcSys = true })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The daemons really could not write the sysctl.
	for node, d := range s.c.Daemons {
		if _, err := d.WaitLog(ctx, "cannot set net.ipv4.tcp_migrate_req"); err != nil {
			t.Fatalf("daemon on %s: %v", node, err)
		}
		if !strings.Contains(d.Log(), "read-only file system") {
			t.Fatalf("daemon on %s failed the sysctl for another reason:\n%s", node, d.Log())
		}
	}
	stalls := newStallDump(ctx, s.c)
	load := startConnLoadWatched(ctx, s, "client", 8, stalls.dump)
	start := time.Now()
	// Three upgrades of each node: without steering, each close of an old
	// daemon's listeners loses what its queue holds about half the time.
	for _, node := range []string{"node-a", "node-b", "node-a", "node-b", "node-a", "node-b"} {
		old := s.c.Daemons[node]
		next, err := s.c.StartDaemon(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		stalls.started(next)
		load.await(t, 100) // both listen
		if err := s.c.StopDaemon(old); err != nil {
			t.Fatalf("old daemon on %s: %v", node, err)
		}
		stalls.stopped(old)
		load.await(t, 100) // the new one alone
	}
	ok, failed, errs := load.finish()
	t.Logf("upgrade of both nodes' daemons under load with /proc/sys read-only: %d connection attempts in %v, %d failed %q",
		ok+failed, time.Since(start).Round(time.Millisecond), failed, errs)
	if ok == 0 {
		t.Fatal("no connection succeeded")
	}
	if failed != 0 {
		t.Errorf("%d of %d new connections lost during the upgrades", failed, ok+failed)
	}
	if d := stalls.String(); d != "" && t.Failed() {
		t.Log(d)
	}
}
