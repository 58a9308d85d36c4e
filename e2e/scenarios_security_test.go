package e2e

// The security rows of docs/ztunnel-scenarios.md (issue 21): what ztunnel's
// tests/direct.rs and tests/namespaced.rs check where a slip would let
// traffic through that should not pass, reproduced through real daemons in
// the netns lab.

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"golang.org/x/sys/unix"
)

// portInUseConfig is the one workload of the port-in-use daemons.
const portInUseConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
`

// writeDaemonFiles writes config (LOCAL_XDS_PATH) and a fresh built-in CA's
// root and key into a temporary directory and returns their paths.
func writeDaemonFiles(t *testing.T, config string) (cfgPath, caCert, caKey string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := caclient.NewBuiltinCA("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"config.yaml": []byte(config), "ca.pem": ca.RootPEM(), "ca-key.pem": ca.KeyPEM()}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "config.yaml"), filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
}

// TestPortInUse is ztunnel's test_conflicting_bind_error_* (direct.rs): a
// daemon whose listener address is already bound fails to start, with an
// error naming the address, instead of running without that listener. Each
// port is held once by a plain listener (ztunnel's case) and once by a
// listener that set SO_REUSEPORT, as the same user (root): a dedicated
// daemon must not join that socket's reuseport group and share the port's
// connections with a stranger (only shared mode sets SO_REUSEPORT, for its
// upgrades, as ztunnel's in-pod sockets do; e2e.TestSharedUpgrade).
func TestPortInUse(t *testing.T) {
	lab := netnslab.New(t)
	node, err := lab.AddNode("node-a")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath, caCert, caKey := writeDaemonFiles(t, portInUseConfig)
	start := func(ctx context.Context, noWait bool) (*labrun.Daemon, error) {
		return labrun.StartDaemon(ctx, pod, labrun.DaemonOptions{
			Binary: ztunnelBin, ConfigPath: cfgPath, CACert: caCert, CAKey: caKey,
			Workload: "default/client/client", NoWait: noWait,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// With every port free the same daemon starts and is ready: what fails
	// below is the held port.
	d, err := start(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("daemon with free ports: %v\n%s", err, d.Log())
	}

	ports := []struct {
		name, addr string
	}{
		{"inbound HBONE 15008", "[::]:15008"},
		{"inbound plaintext 15006", "[::]:15006"},
		{"outbound 15001", "[::]:15001"},
		{"admin 15000", "127.0.0.1:15000"},
		{"stats 15020", "[::]:15020"},
		{"readiness 15021", "[::]:15021"},
		{"dns 15053", "127.0.0.1:15053"},
	}
	for _, p := range ports {
		for _, reuse := range []bool{false, true} {
			name := p.name + "/plain_holder"
			if reuse {
				name = p.name + "/holder_with_SO_REUSEPORT"
			}
			t.Run(name, func(t *testing.T) {
				lc := &net.ListenConfig{}
				if reuse {
					lc.Control = func(_, _ string, c syscall.RawConn) error {
						var serr error
						if err := c.Control(func(fd uintptr) {
							serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
						}); err != nil {
							return err
						}
						return serr
					}
				}
				ln, err := pod.ListenWith(ctx, lc, "tcp", p.addr)
				if err != nil {
					t.Fatalf("holding %s: %v", p.addr, err)
				}
				defer ln.Close()
				d, err := start(ctx, true)
				if err != nil {
					t.Fatal(err)
				}
				wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
				defer wcancel()
				werr := d.Wait(wctx)
				if wctx.Err() != nil {
					d.Stop()
					t.Fatalf("daemon still running with %s held:\n%s", p.addr, d.Log())
				}
				if werr == nil {
					t.Fatalf("daemon exited 0 with %s held:\n%s", p.addr, d.Log())
				}
				line, err := d.WaitLog(ctx, "ztunnel: failed to start:")
				if err != nil {
					t.Fatalf("%v\n%s", err, d.Log())
				}
				if !strings.Contains(line, p.addr) || !strings.Contains(line, "address already in use") {
					t.Fatalf("start-up error does not name %s as in use: %s", p.addr, line)
				}
			})
		}
	}
}
