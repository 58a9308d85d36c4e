package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/inpod"
	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// TestSharedAddSwitchesOnce adds a pod through a fake CNI agent's ZDS
// stream to a shared-mode daemon run in this process (app.Start, with its
// real proxy, DNS proxy and certificate warmer) and counts the switches of
// a thread into the pod's network namespace the add makes (inpod.Switches):
// one, for every socket of the pod and tcp_migrate_req together. There was
// one per listener and address before (six with the DNS proxy and
// INPOD_PORT_REUSE), and each could wait on the OS scheduler (issue 36).
// A port already taken in the pod fails the add with the message it had
// when every socket had its own switch, and leaves nothing of the pod's
// proxy listening.
func TestSharedAddSwitchesOnce(t *testing.T) {
	if missing := netnslab.Missing(); missing != "" {
		netnslab.Skip(t, missing)
	}
	lab := netnslab.New(t)
	node, err := lab.AddNode("node-a")
	if err != nil {
		t.Fatal(err)
	}
	// The pod's sockets after the add: the proxy's three listeners and the
	// DNS proxy's TCP listener (its UDP socket shares the port).
	ports := []string{"127.0.0.1:15001", "127.0.0.1:15006", "127.0.0.1:15008", "127.0.0.1:15053"}
	cases := []struct {
		name string
		env  map[string]string
		// taken, when set, is a socket made in the pod before the add.
		taken func(*netnslab.Pod) (io.Closer, error)
		// nack is the add's Nack ("" for an Ack), %[1]s the pod's name.
		nack string
		// open are the ports that answer in the pod after the add (the
		// others of ports must refuse).
		open []string
	}{
		{name: "proxy, DNS proxy and tcp_migrate_req", open: ports},
		{name: "proxy alone", env: map[string]string{"ISTIO_META_DNS_CAPTURE": "false", "INPOD_PORT_REUSE": "false"},
			open: ports[:3]},
		{
			name: "inbound plaintext port taken",
			taken: func(p *netnslab.Pod) (io.Closer, error) {
				return p.Listen("tcp", "[::]:15006")
			},
			nack: "failure to start proxy for uid-%[1]s: proxy default/%[1]s: engine: listen [::]:15006: listen tcp 0.0.0.0:15006: bind: address already in use",
			open: []string{"127.0.0.1:15006"}, // the test's socket
		},
		{
			name: "DNS port taken",
			taken: func(p *netnslab.Pod) (io.Closer, error) {
				return p.ListenPacket("udp", "127.0.0.1:15053")
			},
			nack: "failure to start proxy for uid-%[1]s: dnsproxy: default/%[1]s: bind 127.0.0.1:15053: listen udp 127.0.0.1:15053: bind: address already in use",
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := node.AddPod(fmt.Sprintf("pod-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if tc.taken != nil {
				c, err := tc.taken(pod)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
			agent := startSharedDaemon(t, pod.Name, tc.env)
			before := inpod.Switches()
			nack, err := agent.Add(zdstest.Pod{UID: "uid-" + pod.Name, Name: pod.Name, Namespace: "default",
				ServiceAccount: "sa", NetnsPath: pod.Path()})
			if err != nil {
				t.Fatal(err)
			}
			switches := inpod.Switches() - before
			want := ""
			if tc.nack != "" {
				want = fmt.Sprintf(tc.nack, pod.Name)
			}
			if nack != want {
				t.Errorf("add answered %q, want %q", nack, want)
			}
			if switches != 1 {
				t.Errorf("the add switched into the pod's namespace %d times, want 1", switches)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, addr := range ports {
				// The proxy resets a connection to its own ports at once
				// (at times before the dial returns): only a refusal says
				// nothing listens.
				c, err := pod.Dial(ctx, "tcp", addr)
				if err == nil {
					c.Close()
				}
				refused := errors.Is(err, syscall.ECONNREFUSED)
				if open := slices.Contains(tc.open, addr); open == refused {
					t.Errorf("%s in the pod: %v; want it listening: %v", addr, err, open)
				}
			}
		})
	}
}

// startSharedDaemon starts a shared-mode daemon in this process, in the
// test's own network namespace, connected to a fake CNI agent that knows
// no pod yet, and returns the agent once the daemon has acknowledged its
// (empty) snapshot. env adds to or overrides the daemon's variables.
func startSharedDaemon(t *testing.T, pod string, env map[string]string) *zdstest.Server {
	t.Helper()
	dir := t.TempDir()
	agent, err := zdstest.Start(zdstest.Config{Path: filepath.Join(dir, "ztunnel.sock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close() })
	vars := map[string]string{
		"PROXY_MODE":             "shared",
		"INPOD_UDS":              agent.Path(),
		"NODE_NAME":              "node-a",
		"LOCAL_XDS":              fmt.Sprintf(`{workloads: [{uid: uid-%[1]s, name: %[1]s, namespace: default, serviceAccount: sa, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}]}`, pod),
		"ZTUNNEL_ADMIN_ADDR":     "127.0.0.1:0",
		"ZTUNNEL_STATS_ADDR":     "127.0.0.1:0",
		"ZTUNNEL_READINESS_ADDR": "127.0.0.1:0",
		"ZTUNNEL_RESOLV_CONF":    filepath.Join(dir, "resolv.conf"), // none: no upstreams
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := ParseEnv(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Start(ctx, cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if err := agent.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return agent
}
