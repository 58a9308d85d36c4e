package e2e

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
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

// dialEcho connects pod to addr and checks one round trip.
func dialEcho(ctx context.Context, pod *netnslab.Pod, addr netip.AddrPort, msg string) (net.Conn, error) {
	c, err := pod.Dial(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	if err := nettest.RoundTrip(c, msg); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitDialEcho retries dialEcho until it works, failing after a generous
// limit (a daemon recovering may refuse a few first).
func waitDialEcho(t *testing.T, pod *netnslab.Pod, addr netip.AddrPort, msg string) net.Conn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := dialEcho(ctx, pod, addr, msg)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s -> %s never recovered: %v", pod.Name, addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
