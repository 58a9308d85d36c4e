package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/state"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(idleHelperEnv); role != "" {
		os.Exit(runIdleHelper(role)) // BenchmarkIdleConnMemory's proxies
	}
	goleak.VerifyTestMain(m)
}

// srvPolicyConfig starts the snapshots of the inbound rigs: the workload
// "srv" at 127.0.0.1 (HBONE), then the policies each test appends.
const srvPolicyConfig = `
workloads:
- uid: u-srv
  name: srv
  namespace: ns
  serviceAccount: srv
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  services: {}
policies:
`

func TestInboundHBONE(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		app := echoApp(t)
		denied := echoApp(t)
		rig := startInbound(t, denied, withEngine(eng))

		t.Run("echo", func(t *testing.T) {
			s, err := rig.connect(t, "client", fmt.Sprintf("127.0.0.1:%d", app))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.Write([]byte("hello through the tunnel"))
			s.CloseWrite()
			got, err := io.ReadAll(s)
			if err != nil || string(got) != "hello through the tunnel" {
				t.Fatalf("got %q, %v", got, err)
			}
		})

		statusTests := []struct {
			name      string
			authority string
			want      int
		}{
			{"denied by policy", fmt.Sprintf("127.0.0.1:%d", denied), 401},
			{"unparsable authority", "example.com", 400},
			{"authority ip mismatch", fmt.Sprintf("127.0.0.2:%d", app), 400},
			{"illegal port", fmt.Sprintf("127.0.0.1:%d", rig.hbonePort), 400},
			{"nothing listening", fmt.Sprintf("127.0.0.1:%d", freePort(t)), 503},
		}
		for _, tc := range statusTests {
			t.Run(tc.name, func(t *testing.T) {
				_, err := rig.connect(t, "client", tc.authority)
				var se *hbone.StatusError
				if !errors.As(err, &se) || se.Code != tc.want {
					t.Fatalf("CONNECT %s: %v, want status %d", tc.authority, err, tc.want)
				}
			})
		}
	})
}

func TestInboundRejectsForeignTrustDomain(t *testing.T) {
	rig := startInbound(t, 1)
	other := tlstest.NewCA(t, "evil.example")
	cert := tlstest.Cert(t, other, identity.New("evil.example", "ns", "client"))
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", rig.hbonePort))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, &tls.Config{
		Certificates: []tls.Certificate{cert.Certificate}, InsecureSkipVerify: true,
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
	})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3 clients learn of a rejected certificate on the first read.
		_, err = tc.Read(make([]byte, 1))
	}
	if err == nil {
		t.Fatal("a client from another trust domain completed the handshake")
	}
}

// TestPolicyChangeClosesOpenConnections pushes a policy while two tunnels
// are open: the one it denies is reset, the one it still allows goes on.
func TestPolicyChangeClosesOpenConnections(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		app := echoApp(t)
		rig := startInbound(t, 1, withEngine(eng))
		authority := fmt.Sprintf("127.0.0.1:%d", app)
		open := func(sa string) *hbone.Stream {
			s, err := rig.connect(t, sa, authority)
			if err != nil {
				t.Fatal(err)
			}
			s.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := s.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(s, make([]byte, 4)); err != nil {
				t.Fatal(err)
			}
			return s
		}
		good, bad := open("good"), open("bad")
		defer good.Close()
		defer bad.Close()

		// Push: DENY the "bad" service account (keep the rig's port DENY).
		old := rig.store.Load()
		deny := &state.Policy{
			Name: "deny-bad", Namespace: "ns", Scope: state.ScopeNamespace, Action: state.ActionDeny,
			Rules: [][][]state.Match{{{{Principals: []state.StringMatch{{Kind: state.MatchSuffix, Value: "/sa/bad"}}}}}},
		}
		next, err := state.NewSnapshot(old.Workloads(), old.Services(), append(append([]*state.Policy(nil), old.Policies()...), deny))
		if err != nil {
			t.Fatal(err)
		}
		rig.store.Publish(next)

		_, err = io.ReadAll(bad)
		var se *hbone.StreamError
		if !errors.As(err, &se) {
			t.Fatalf("denied tunnel read: %v, want a stream reset", err)
		}
		if _, err := good.Write([]byte("pong")); err != nil {
			t.Fatalf("allowed tunnel after the push: %v", err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(good, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("allowed tunnel after the push: %q, %v", buf, err)
		}
	})
}
