package e2e

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// fdBudgetConfig is the one meshed workload of TestFDBudgetFlood; the
// flooder and the honest client are pods of no workload on its node.
const fdBudgetConfig = `
workloads:
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
`

// TestFDBudgetFlood is the attack issue 32 found against a dedicated
// daemon: one unauthenticated peer holds idle plaintext connections on
// 15006 (two descriptors each) until the daemon's descriptors run out and
// honest clients fail. With the descriptor budget (ZTUNNEL_FD_BUDGET, small
// here so that the flood reaches it fast) the flooder is refused at its
// share, an honest pod is still served, and the daemon counts and logs the
// refusals.
func TestFDBudgetFlood(t *testing.T) {
	const budget, maxConns = 200, 200
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, fdBudgetConfig, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
		ExtraPods: map[string][]string{"node-a": {"flooder", "honest"}},
		DaemonEnv: []string{"ZTUNNEL_FD_BUDGET=200"},
	})
	d := c.Daemons["server"]
	startEcho(t, c.Pods["server"], 8080)
	dst := netip.AddrPortFrom(c.Pods["server"].IP, 8080)

	// Each held connection has made one round trip: it is relayed, and
	// holds its descriptors until the end of the flood.
	var held []net.Conn
	defer func() {
		for _, conn := range held {
			conn.Close()
		}
	}()
	for len(held) < maxConns {
		conn, err := dialEcho(ctx, c.Pods["flooder"], dst, "flood")
		if err != nil {
			break // refused: reset by the daemon
		}
		held = append(held, conn)
	}
	if len(held) == maxConns || len(held) > budget/4 {
		t.Fatalf("the flooder holds %d connections (%d descriptors), past its share of a budget of %d", len(held), 2*len(held), budget)
	}
	if _, err := d.WaitLog(ctx, "descriptor budget refused a connection", `listener="inbound_plaintext"`, `reason="peer"`); err != nil {
		t.Fatal(err)
	}
	var refusals float64
	for _, m := range scrapeDaemon(ctx, t, d)["ztunnel_go_fd_budget_refusals_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["listener"] == "inbound_plaintext" && labels["reason"] == "peer" {
			refusals += m.GetCounter().GetValue()
		}
	}
	if refusals < 1 {
		t.Errorf("ztunnel_go_fd_budget_refusals_total{listener=inbound_plaintext,reason=peer} = %v during the flood", refusals)
	}
	conn, err := dialEcho(ctx, c.Pods["honest"], dst, "honest")
	if err != nil {
		t.Fatalf("an honest pod during the flood (the flooder holds %d connections): %v", len(held), err)
	}
	conn.Close()
}
