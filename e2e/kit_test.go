package e2e

import (
	"context"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// startSharedCluster starts a shared-mode cluster in lab for t (see
// labrun.StartSharedCluster). It is stopped when the test ends, and every
// daemon's log is printed if the test failed.
func startSharedCluster(ctx context.Context, t *testing.T, lab *netnslab.Lab, config string, o labrun.SharedOptions) *labrun.SharedCluster {
	t.Helper()
	c, err := labrun.StartSharedCluster(ctx, lab, []byte(config), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("stopping daemons: %v", err)
		}
		if t.Failed() {
			for _, d := range c.AllDaemons() {
				t.Logf("daemon %s log:\n%s", d.Pod.Name, d.Log())
			}
		}
	})
	return c
}

// startEcho starts an echo server on port in pod, closed when the test ends.
func startEcho(t *testing.T, pod *netnslab.Pod, port uint16) *labrun.EchoServer {
	t.Helper()
	s, err := labrun.StartEcho(pod, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
