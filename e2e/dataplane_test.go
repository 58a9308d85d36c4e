package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// labConfig is the mesh of the data-path tests. Node node-a holds client
// (HBONE), plain (a TCP-protocol workload, no daemon) and strict (HBONE, with
// STRICT mTLS); node-b holds server and locked (HBONE). The pod "outsider" on node-b is in no config.
const labConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/plain
  name: plain
  namespace: default
  serviceAccount: plain
  workloadIps: ["10.244.0.3"]
  protocol: TCP
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/strict
  name: strict
  namespace: default
  serviceAccount: strict
  workloadIps: ["10.244.0.4"]
  protocol: HBONE
  node: node-a
  services: {}
  authorizationPolicies: ["default/strict-mtls"]
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  services: {}
- uid: cluster1//v1/Pod/default/locked
  name: locked
  namespace: default
  serviceAccount: locked
  workloadIps: ["10.244.1.3"]
  protocol: HBONE
  node: node-b
  services: {}
  authorizationPolicies: ["default/only-client"]
policies:
# PeerAuthentication STRICT as istiod converts it: deny any peer without an
# mTLS identity.
- name: strict-mtls
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - notPrincipals:
        - Presence: []
- name: deny-9999
  namespace: default
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - destinationPorts: [9999]
- name: only-client
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: false
  rules:
  - - - principals:
        - Exact: cluster.local/ns/default/sa/client
`

type dataplane struct {
	cluster *labrun.Cluster
	echo    map[string]*labrun.EchoServer // "pod:port"
}

func startDataplane(t *testing.T, env ...string) *dataplane {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, labConfig, labrun.ClusterOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), ExtraPods: map[string][]string{"node-b": {"outsider"}}, DaemonEnv: env,
	})
	dp := &dataplane{cluster: c, echo: map[string]*labrun.EchoServer{}}
	for _, pe := range []struct {
		pod  string
		port uint16
	}{{"server", 8080}, {"server", 9999}, {"plain", 8080}, {"outsider", 8080}, {"locked", 8080}, {"strict", 8080}} {
		s := startEcho(t, c.Pods[pe.pod], pe.port)
		dp.echo[fmt.Sprintf("%s:%d", pe.pod, pe.port)] = s
	}
	return dp
}

// dial connects from inside pod `from` to pod `to` on port, as an app in
// that pod would (through its capture rules).
func (dp *dataplane) dial(t *testing.T, from, to string, port uint16) *net.TCPConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(dp.cluster.Pods[to].IP, port)
	c, err := dp.cluster.Pods[from].Dial(ctx, "tcp", dst.String())
	if err != nil {
		t.Fatalf("dial %s -> %s: %v", from, dst, err)
	}
	return c.(*net.TCPConn)
}

// expectRefused checks that a connection from pod `from` to `to`:port is
// reset without delivering a byte. The reset may race the client's connect.
func (dp *dataplane) expectRefused(t *testing.T, from, to string, port uint16) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(dp.cluster.Pods[to].IP, port)
	conn, err := dp.cluster.Pods[from].Dial(ctx, "tcp", dst.String())
	if err != nil {
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("dial %s -> %s: %v, want a reset", from, dst, err)
		}
		return
	}
	defer conn.Close()
	got, err := roundTrip(conn.(*net.TCPConn), []byte("should not arrive"))
	reset := errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOTCONN)
	if !reset || len(got) != 0 {
		t.Fatalf("%s -> %s: read %q, err %v; want a reset", from, dst, got, err)
	}
}

// roundTrip sends payload, half-closes, and returns everything read back.
func roundTrip(c *net.TCPConn, payload []byte) ([]byte, error) {
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return nettest.Exchange(c, payload)
}

// TestDataPath runs the data-path cases on the daemons' defaults, where the
// HBONE connections, both the pooled outbound ones and those their 15008
// accepts, are owned by the engine's event loops (proxy.LoopDrive) and the
// loops block in epoll_wait: at the end each daemon that carried HBONE
// counts loop-owned connections in its /config_dump.
func TestDataPath(t *testing.T) {
	dp := testDataPath(t)
	for _, pod := range []string{"client", "server"} {
		if n := dp.loopConns(t, pod); n == 0 {
			t.Errorf("%s's daemon owns no HBONE connection in its loops", pod)
		}
	}
}

// TestDataPathHBONEGoroutines is TestDataPath on hbone's goroutine driver:
// on the std backend no loop can own an HBONE connection, so each has a
// reader and a writer goroutine (as inner double-HBONE tunnels and
// connections crypto/tls protects have on any backend). Every case must
// hold the same, and no loop owns a connection.
func TestDataPathHBONEGoroutines(t *testing.T) {
	dp := testDataPath(t, "ZTUNNEL_ENGINE=std")
	for _, pod := range []string{"client", "server"} {
		if n := dp.loopConns(t, pod); n != 0 {
			t.Errorf("%s's daemon owns %d HBONE connections in its loops on the std backend", pod, n)
		}
	}
}

// loopConns reads engine.conns, the HBONE connections the loops own, from
// pod's daemon's /config_dump.
func (dp *dataplane) loopConns(t *testing.T, pod string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := dp.cluster.Daemons[pod].Get(ctx, "http://127.0.0.1:15000/config_dump")
	if err != nil || code != 200 {
		t.Fatalf("config_dump of %s: %d %v", pod, code, err)
	}
	var dump struct {
		Engine struct {
			Conns *int `json:"conns"`
		} `json:"engine"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatal(err)
	}
	if dump.Engine.Conns == nil {
		t.Fatalf("%s's /config_dump has no engine.conns: %s", pod, body)
	}
	return *dump.Engine.Conns
}

// testDataPath runs the data-path cases on a dataplane whose daemons get
// env, and returns it.
func testDataPath(t *testing.T, env ...string) *dataplane {
	dp := startDataplane(t, env...)
	clientIP := dp.cluster.Pods["client"].IP
	logCtx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	t.Run("hbone large transfer both ways", func(t *testing.T) {
		payload := make([]byte, 64<<20)
		rand.Read(payload)
		c := dp.dial(t, "client", "server", 8080)
		defer c.Close()
		got, err := roundTrip(c, payload)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(payload) {
			t.Fatalf("echo of %d bytes came back as %d different bytes", len(payload), len(got))
		}
		// It went through HBONE: the server's daemon saw the client's identity.
		if _, err := dp.cluster.Daemons["server"].WaitLog(logCtx(), "connection complete", `direction="inbound"`,
			`src.identity="spiffe://cluster.local/ns/default/sa/client"`, fmt.Sprintf("bytes_sent=%d", len(payload))); err != nil {
			t.Fatal(err)
		}
		if _, err := dp.cluster.Daemons["client"].WaitLog(logCtx(), "connection complete", `direction="outbound"`,
			`dst.hbone_addr="10.244.1.2:8080"`); err != nil {
			t.Fatal(err)
		}
		// Original source preserved: the app saw the client pod's address.
		if !sawPeer(dp.echo["server:8080"], clientIP) {
			t.Fatalf("server app peers %v lack the client IP %s", dp.echo["server:8080"].Peers(), clientIP)
		}
	})

	t.Run("hbone many small connections", func(t *testing.T) {
		var g errgroup.Group
		g.SetLimit(16)
		for i := range 64 {
			g.Go(func() error {
				c := dp.dial(t, "client", "server", 8080)
				defer c.Close()
				var want bytes.Buffer
				for j := range 20 {
					fmt.Fprintf(&want, "conn %d message %d\n", i, j)
				}
				got, err := roundTrip(c, want.Bytes())
				if err != nil {
					return err
				}
				if !bytes.Equal(got, want.Bytes()) {
					return fmt.Errorf("conn %d: got %q", i, got)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("half close keeps the other direction open", func(t *testing.T) {
		c := dp.dial(t, "client", "server", 8080)
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("before half-close")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len("before half-close"))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		// The echo server half-closes back once it reads EOF.
		rest, err := io.ReadAll(c)
		if err != nil || len(rest) != 0 {
			t.Fatalf("after half-close: %q, %v; want clean EOF", rest, err)
		}
	})

	t.Run("reset from the server reaches the client", func(t *testing.T) {
		c := dp.dial(t, "client", "server", 8080)
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("hello"))
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		dp.echo["server:8080"].ResetAll()
		_, err := io.ReadAll(c)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client read after server reset: %v, want ECONNRESET", err)
		}
	})

	t.Run("tcp protocol workload", func(t *testing.T) {
		c := dp.dial(t, "client", "plain", 8080)
		defer c.Close()
		got, err := roundTrip(c, []byte("plain tcp"))
		if err != nil || string(got) != "plain tcp" {
			t.Fatalf("got %q, %v", got, err)
		}
		line, err := dp.cluster.Daemons["client"].WaitLog(logCtx(), "connection complete", `direction="outbound"`, `dst.workload="plain"`)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "hbone_addr") {
			t.Fatalf("TCP workload went through HBONE: %s", line)
		}
	})

	t.Run("unknown address passes through", func(t *testing.T) {
		c := dp.dial(t, "client", "outsider", 8080)
		defer c.Close()
		got, err := roundTrip(c, []byte("passthrough"))
		if err != nil || string(got) != "passthrough" {
			t.Fatalf("got %q, %v", got, err)
		}
		if _, err := dp.cluster.Daemons["client"].WaitLog(logCtx(), "connection complete", `direction="outbound"`, "dst.addr=10.244.1.4:8080"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("plaintext into a pod goes through 15006", func(t *testing.T) {
		c := dp.dial(t, "outsider", "server", 8080)
		defer c.Close()
		got, err := roundTrip(c, []byte("plaintext in"))
		if err != nil || string(got) != "plaintext in" {
			t.Fatalf("got %q, %v", got, err)
		}
		if _, err := dp.cluster.Daemons["server"].WaitLog(logCtx(), "connection complete", `direction="inbound"`, "src.addr=10.244.1.4"); err != nil {
			t.Fatal(err)
		}
		if !sawPeer(dp.echo["server:8080"], dp.cluster.Pods["outsider"].IP) {
			t.Fatal("original source of a plaintext connection was not preserved")
		}
	})

	t.Run("deny policy on a port", func(t *testing.T) {
		before := len(dp.echo["server:9999"].Peers())
		dp.expectRefused(t, "client", "server", 9999)
		if _, err := dp.cluster.Daemons["server"].WaitLog(logCtx(), "connection complete", "default/deny-9999"); err != nil {
			t.Fatal(err)
		}
		if after := len(dp.echo["server:9999"].Peers()); after != before {
			t.Fatal("the app behind a DENY policy received a connection")
		}
	})

	t.Run("allow policy admits one identity", func(t *testing.T) {
		c := dp.dial(t, "client", "locked", 8080)
		defer c.Close()
		got, err := roundTrip(c, []byte("allowed"))
		if err != nil || string(got) != "allowed" {
			t.Fatalf("allowed identity: got %q, %v", got, err)
		}
	})

	t.Run("allow policy refuses plaintext", func(t *testing.T) {
		dp.expectRefused(t, "outsider", "locked", 8080)
	})

	t.Run("STRICT mTLS refuses plaintext and admits HBONE", func(t *testing.T) {
		dp.expectRefused(t, "outsider", "strict", 8080)
		if _, err := dp.cluster.Daemons["strict"].WaitLog(logCtx(), "connection complete", "default/strict-mtls"); err != nil {
			t.Fatal(err)
		}
		c := dp.dial(t, "client", "strict", 8080)
		defer c.Close()
		got, err := roundTrip(c, []byte("over mTLS"))
		if err != nil || string(got) != "over mTLS" {
			t.Fatalf("HBONE into a STRICT pod: %q, %v", got, err)
		}
	})

	t.Run("allow policy refuses another identity", func(t *testing.T) {
		cert := tlstest.Cert(t, dp.cluster.CA, identity.New("", "default", "intruder"))
		_, err := dp.connectFrom(t, "outsider", cert, "locked", "10.244.1.3:8080", "spiffe://cluster.local/ns/default/sa/locked")
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != 401 {
			t.Fatalf("CONNECT as intruder: %v, want status 401", err)
		}
	})

	t.Run("unparsable authority is a 400", func(t *testing.T) {
		cert := tlstest.Cert(t, dp.cluster.CA, identity.New("", "default", "client"))
		_, err := dp.connectFrom(t, "outsider", cert, "server", "not-an-address", "spiffe://cluster.local/ns/default/sa/server")
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != 400 {
			t.Fatalf("CONNECT to a bad authority: %v, want status 400", err)
		}
	})

	t.Run("certificate from another CA is rejected", func(t *testing.T) {
		other := tlstest.NewCA(t, "cluster.local")
		cert := tlstest.Cert(t, other, identity.New("", "default", "client"))
		// Trust anything on our side, so a failure can only be the server's.
		cfg := &tls.Config{
			Certificates: []tls.Certificate{cert.Certificate}, InsecureSkipVerify: true,
			MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
		}
		_, err := dp.connectWith(t, "outsider", cfg, "server", "10.244.1.2:8080")
		if err == nil {
			t.Fatal("a peer with a foreign CA's certificate got a tunnel")
		}
		if _, err := dp.cluster.Daemons["server"].WaitLog(logCtx(), "connection failed", "tls handshake", "src.addr=10.244.1.4"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("garbage on 15008 does not hurt the daemon", func(t *testing.T) {
		for _, junk := range []string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x16\x03\x01\x00\x05hello", strings.Repeat("\x00", 4096)} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			raw, err := dp.cluster.Pods["outsider"].Dial(ctx, "tcp", "10.244.1.2:15008")
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			raw.SetDeadline(time.Now().Add(15 * time.Second))
			raw.Write([]byte(junk))
			io.Copy(io.Discard, raw) // the daemon closes it
			raw.Close()
		}
		c := dp.dial(t, "client", "server", 8080)
		defer c.Close()
		if got, err := roundTrip(c, []byte("still serving")); err != nil || string(got) != "still serving" {
			t.Fatalf("after garbage: %q, %v", got, err)
		}
	})
	return dp
}

// connectFrom opens an HBONE tunnel from inside pod `from` (not through its
// daemon) to pod `to`'s 15008 with cert, and CONNECTs to authority.
func (dp *dataplane) connectFrom(t *testing.T, from string, cert *mtls.WorkloadCert, to, authority, san string) (*hbone.Stream, error) {
	t.Helper()
	return dp.connectWith(t, from, mtls.ClientConfig(cert, []string{san}), to, authority)
}

// connectWith is connectFrom with an explicit TLS config.
func (dp *dataplane) connectWith(t *testing.T, from string, cfg *tls.Config, to, authority string) (*hbone.Stream, error) {
	t.Helper()
	return hboneTunnel(context.Background(), t, dp.cluster.Pods[from], cfg, dp.cluster.Pods[to].IP, authority)
}

func sawPeer(s *labrun.EchoServer, ip netip.Addr) bool {
	for _, p := range s.Peers() {
		if p.Addr() == ip {
			return true
		}
	}
	return false
}
