package e2e

// The port rows of docs/ztunnel-scenarios.md's security part (issue 21):
// start-up with a port in use (direct.rs) and the in-pod port matrix
// (namespaced.rs malicious_calls_inpod), through real daemons in the netns
// lab.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
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
	pod, cfgPath, caCert, caKey := oneDedicatedPod(t, netnslab.New(t), portInUseConfig)
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
		name, network, addr string
	}{
		{"inbound HBONE 15008", "tcp", "[::]:15008"},
		{"inbound plaintext 15006", "tcp", "[::]:15006"},
		{"outbound 15001", "tcp", "[::]:15001"},
		{"admin 15000", "tcp", "127.0.0.1:15000"},
		{"stats 15020", "tcp", "[::]:15020"},
		{"readiness 15021", "tcp", "[::]:15021"},
		{"dns 15053", "tcp", "127.0.0.1:15053"},
		{"dns 15053 udp", "udp", "127.0.0.1:15053"},
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
				var held io.Closer
				err := pod.Do(func() error {
					var err error
					if p.network == "udp" {
						held, err = lc.ListenPacket(ctx, p.network, p.addr)
					} else {
						held, err = lc.Listen(ctx, p.network, p.addr)
					}
					return err
				})
				if err != nil {
					t.Fatalf("holding %s/%s: %v", p.network, p.addr, err)
				}
				defer held.Close()
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

// maliciousConfig is malicious_calls_inpod's node (namespaced.rs, shared
// mode): a captured client and an uncaptured pod (a TCP workload) on
// node-a (node 1: the fake istiod's node cp is 0). The daemon's own pod
// (10.244.1.4, made after them) is a workload too, as ztunnel's test
// registers it: the fake istiod sends it, as istiod does for the ztunnel
// pod.
const maliciousConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/uncaptured, name: uncaptured, namespace: default, serviceAccount: uncaptured, workloadIps: ["10.244.1.3"], protocol: TCP, node: node-a, services: {}}
`

// callOutcome is what a call of the port matrix must meet (ztunnel's
// Failure in malicious_calls_test).
type callOutcome int

const (
	// refusedConn: the connection cannot even be made.
	refusedConn callOutcome = iota
	// failedRequest: it connects, but the request (15 bytes of garbage, 15
	// bytes read back) fails: the proxy closes or resets it. A reset so
	// quick that the dial reports it (ECONNRESET, not a refusal) counts.
	failedRequest
	// httpError: it connects and the answer starts "HTTP/1.1 400".
	httpError
)

func (o callOutcome) String() string {
	return [...]string{"connection refused", "request fails", "HTTP/1.1 400"}[o]
}

// TestMaliciousCallsInPod is ztunnel's malicious_calls_inpod (row 23): the
// 21 calls of a captured pod and the 14 of an uncaptured one to the
// daemon's pod IP, the captured pod's own IP and 127.0.0.1, on every port
// the daemon serves (15001, 15006, 15008, 15080, 15000, 15020, 15021), each
// with ztunnel's outcome. No call may loop through a proxy back into it, reach
// the admin port or SOCKS5 from outside loopback, or hang: a refusal must
// come within ztunnel's 1 s (3 s here, for a loaded lab). As in ztunnel's
// test the daemon's own pod is an HBONE workload of the mesh, so the
// captured client's calls to it go over HBONE to its self-proxy (checked in
// its access log for 15020 and 15021), not through as plain TCP.
func TestMaliciousCallsInPod(t *testing.T) {
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	istiod := newFakeIstiod(t, cp, 15012)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, maliciousConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: append(istiod.env(), "SERVICE_ACCOUNT=ztunnel", "ISTIO_META_CLUSTER_ID=Kubernetes"),
	})
	d := c.Daemons["node-a"]
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := d.WaitLog(wctx, "self-proxy started"); err != nil {
		t.Fatal(err)
	}
	istiod.Set(xdsconv.AddressType, "u-zt-a", "1", xdsPod("u-zt-a", d.Pod.Name, "istio-system", "ztunnel", d.Pod.IP.String(), "node-a", "Kubernetes", "ztunnel"))
	waitWorkload(ctx, t, d, d.Pod.IP)
	zt, ourself, localhost := d.Pod.IP, c.Pods["client"].IP, netip.MustParseAddr("127.0.0.1")
	type call struct {
		ip   netip.Addr
		port uint16
		want callOutcome
	}
	matrix := []struct {
		from  string
		calls []call
	}{
		{"client", []call{
			// To the daemon's pod: the client's outbound tunnels each to
			// the self-proxy, whose dial finds nothing but 15020/15021.
			{zt, 15001, failedRequest},
			{zt, 15006, failedRequest},
			{zt, 15008, failedRequest},      // a tunnel to 15008 itself is refused
			{zt, 15080, failedRequest},      // SOCKS5 is off (and loopback only)
			{zt, 15000, failedRequest},      // admin is on the daemon's loopback
			{zt, 15020, httpError},          // metrics answer garbage with 400
			{zt, 15021, httpError},          // readiness too
			{ourself, 15001, failedRequest}, // a call into its own outbound listener: a loop, refused
			{ourself, 15006, failedRequest}, // into its own plaintext inbound: a loop, refused
			{ourself, 15008, failedRequest}, // HBONE wants TLS
			{ourself, 15080, refusedConn},   // SOCKS5 is off
			{ourself, 15000, refusedConn},   // no admin in the pod
			{ourself, 15020, refusedConn},
			{ourself, 15021, refusedConn},
			{localhost, 15001, failedRequest},
			{localhost, 15006, failedRequest},
			{localhost, 15008, failedRequest},
			{localhost, 15080, refusedConn},
			{localhost, 15000, refusedConn},
			{localhost, 15020, refusedConn},
			{localhost, 15021, refusedConn},
		}},
		{"uncaptured", []call{
			{zt, 15001, refusedConn}, // the daemon's own pod has no outbound listener
			{zt, 15006, refusedConn}, // nor plaintext inbound (the self-proxy is HBONE only)
			{zt, 15008, failedRequest},
			{zt, 15080, refusedConn},
			{zt, 15000, refusedConn}, // admin is loopback only
			{zt, 15020, httpError},
			{zt, 15021, httpError},
			// Into the captured pod: all land on its inbound listeners
			// (15008 directly, the rest through 15006) and are closed.
			{ourself, 15001, failedRequest},
			{ourself, 15006, failedRequest},
			{ourself, 15008, failedRequest},
			{ourself, 15080, failedRequest},
			{ourself, 15000, failedRequest},
			{ourself, 15020, failedRequest},
			{ourself, 15021, failedRequest},
		}},
	}
	const body = "hello world\r\n\r\n"
	for _, m := range matrix {
		pod := c.Pods[m.from]
		for _, cl := range m.calls {
			dst := netip.AddrPortFrom(cl.ip, cl.port)
			who := "daemon"
			switch cl.ip {
			case ourself:
				who = "client"
			case localhost:
				who = "localhost"
			}
			t.Run(fmt.Sprintf("%s_to_%s_%d", m.from, who, cl.port), func(t *testing.T) {
				dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
				defer dcancel()
				conn, err := pod.Dial(dctx, "tcp", dst.String())
				if cl.want == refusedConn {
					if err == nil {
						conn.Close()
						t.Fatalf("%s connected to %s, want %s", m.from, dst, cl.want)
					}
					if !errors.Is(err, syscall.ECONNREFUSED) {
						t.Fatalf("%s to %s: %v, want a refusal (nothing listens)", m.from, dst, err)
					}
					return
				}
				if cl.want == failedRequest && errors.Is(err, syscall.ECONNRESET) {
					// Accepted and reset before the dial looked: a
					// listener took the connection and dropped it, as
					// a failed request means.
					return
				}
				if err != nil {
					t.Fatalf("%s to %s: %v, want a connection", m.from, dst, err)
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(3 * time.Second))
				got := make([]byte, len(body))
				_, err = conn.Write([]byte(body))
				if err == nil {
					_, err = io.ReadFull(conn, got)
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("%s to %s: the connection hangs (no answer, no close within 3s), want %s", m.from, dst, cl.want)
				}
				switch cl.want {
				case failedRequest:
					if err == nil {
						t.Fatalf("%s to %s: the request got %q back, want it to fail", m.from, dst, got)
					}
				case httpError:
					if err != nil || !strings.HasPrefix(string(got), "HTTP/1.1 400") {
						t.Fatalf("%s to %s: %q, %v, want HTTP/1.1 400", m.from, dst, got, err)
					}
				}
			})
		}
	}
	// The captured client's HTTP calls went over HBONE to the self-proxy,
	// as in ztunnel's mesh, not around it.
	for _, port := range []string{"15020", "15021"} {
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := d.WaitLog(lctx, `direction="inbound"`, `src.identity="spiffe://cluster.local/ns/default/sa/client"`,
			`dst.hbone_addr="`+net.JoinHostPort(zt.String(), port)+`"`, "dst.addr="+net.JoinHostPort(zt.String(), "15008")+" ")
		lcancel()
		if err != nil {
			t.Errorf("the client's call to %s:%s did not go over the self-proxy: %v", zt, port, err)
		}
	}
}

// TestIPv6Disabled (issue 34): with IPV6_ENABLED=false every listener of a
// dedicated daemon is IPv4 only, as ztunnel's: an IPv6 connection to any of
// its ports (over the pod's ::1) is refused, where Go's dual-stack sockets
// for 0.0.0.0 used to take it; the same ports answer over IPv4.
func TestIPv6Disabled(t *testing.T) {
	pod, cfgPath, caCert, caKey := oneDedicatedPod(t, netnslab.New(t), portInUseConfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := labrun.StartDaemon(ctx, pod, labrun.DaemonOptions{
		Binary: ztunnelBin, ConfigPath: cfgPath, CACert: caCert, CAKey: caKey,
		Workload: "default/client/client", Env: []string{"IPV6_ENABLED=false", "ISTIO_META_DNS_CAPTURE=true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	// What the operator reads is ztunnel's shape (issue 34): the jq paths
	// .config.proxyMode, .config.ipv6Enabled and serde's durations.
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
	if err != nil || code != 200 {
		t.Fatalf("config_dump: %d %v", code, err)
	}
	var dump struct {
		Config struct {
			ProxyMode    string `json:"proxyMode"`
			IPv6Enabled  *bool  `json:"ipv6Enabled"`
			InboundAddr  string `json:"inboundAddr"`
			SocketConfig struct {
				KeepaliveTime struct{ Secs int } `json:"keepaliveTime"`
			} `json:"socketConfig"`
		} `json:"config"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatal(err)
	}
	if c := dump.Config; c.ProxyMode != "Dedicated" || c.IPv6Enabled == nil || *c.IPv6Enabled || c.InboundAddr != "0.0.0.0:15008" || c.SocketConfig.KeepaliveTime.Secs != 180 {
		t.Errorf("config in /config_dump not in ztunnel's shape: %s", body[:min(len(body), 2000)])
	}
	for _, port := range []int{15000, 15001, 15006, 15008, 15020, 15021, 15053} {
		t.Run(fmt.Sprint(port), func(t *testing.T) {
			c, err := pod.Dial(ctx, "tcp6", fmt.Sprintf("[::1]:%d", port))
			if err == nil {
				c.Close()
				t.Fatalf("an IPv6 connection to [::1]:%d was taken with IPV6_ENABLED=false", port)
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("IPv6 dial to port %d: %v, want connection refused", port, err)
			}
			// Listening over IPv4 (15006 resets a call to its own port
			// at once: a self call).
			c, err = pod.Dial(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
			if errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("IPv4 dial to port %d: %v", port, err)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}

// TestMissingLocalWorkload (issue 34): a dedicated daemon whose own
// workload (PROXY_WORKLOAD_INFO) is not in its config says so at start, a
// warning naming it, and its readiness stays pending on "local workload":
// every connection would wait for the workload and then fail.
func TestMissingLocalWorkload(t *testing.T) {
	pod, cfgPath, caCert, caKey := oneDedicatedPod(t, netnslab.New(t), portInUseConfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := labrun.StartDaemon(ctx, pod, labrun.DaemonOptions{
		Binary: ztunnelBin, ConfigPath: cfgPath, CACert: caCert, CAKey: caKey,
		Workload: "default/ghost/ghost", NoWait: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	line, err := d.WaitLog(ctx, "warn", "local workload not found", "default/ghost")
	if err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}
	t.Logf("daemon: %s", line)
	code, body, err := d.Get(ctx, "http://127.0.0.1:15021/healthz/ready")
	if err != nil || code == 200 || !strings.Contains(string(body), "local workload") {
		t.Fatalf("readiness %d %q %v, want not ready pending on the local workload", code, body, err)
	}
}

// oneDedicatedPod adds node-a with one pod, client, to lab and writes the
// daemon files for config: what a dedicated daemon in that pod needs.
func oneDedicatedPod(t *testing.T, lab *netnslab.Lab, config string) (pod *netnslab.Pod, cfgPath, caCert, caKey string) {
	t.Helper()
	node, err := lab.AddNode("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if pod, err = node.AddPod("client"); err != nil {
		t.Fatal(err)
	}
	cfgPath, caCert, caKey = writeDaemonFiles(t, config)
	return pod, cfgPath, caCert, caKey
}
