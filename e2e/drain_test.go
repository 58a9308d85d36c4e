package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// TestDrain checks ztunnel's shutdown contract on SIGTERM: listeners close at
// once (new connections fail), connections in flight may finish within the
// termination deadline (2s in the lab), the rest are closed at the deadline,
// and the process exits 0. /quitquitquit does the same.
func TestDrain(t *testing.T) {
	dp := startDataplane(t)
	server := dp.cluster.Daemons["server"]

	// An idle connection that will outlive the deadline.
	idle := dp.dial(t, "client", "server", 8080)
	defer idle.Close()
	idle.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := idle.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(idle, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// A transfer in flight that finishes inside the deadline.
	busy := dp.dial(t, "client", "server", 8080)
	defer busy.Close()
	busy.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := busy.Write([]byte("part one,")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(busy, make([]byte, len("part one,"))); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := server.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := server.WaitLog(ctx, "draining"); err != nil {
		t.Fatal(err)
	}

	// The in-flight transfer completes during the drain.
	got, err := roundTrip(busy, []byte("part two"))
	if err != nil || string(got) != "part two" {
		t.Fatalf("in-flight transfer during drain: %q, %v", got, err)
	}

	// New connections are refused: the client's daemon cannot reach 15008.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if c, err := dp.cluster.Pods["client"].Dial(ctx2, "tcp", "10.244.1.2:8080"); err == nil {
		got, err := roundTrip(c.(*net.TCPConn), []byte("after SIGTERM"))
		c.Close()
		if err == nil && string(got) == "after SIGTERM" {
			t.Fatal("a new connection reached the app after SIGTERM")
		}
	}

	// The idle connection is closed at the deadline, not before.
	_, err = io.ReadAll(idle)
	closedAfter := time.Since(start)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the idle connection was never closed")
	}
	if closedAfter < 1500*time.Millisecond {
		t.Errorf("idle connection closed %v after SIGTERM, before the 2s deadline", closedAfter)
	}
	if err := server.Wait(ctx); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v, want status 0", err)
	}

	// /quitquitquit drains and exits 0 as well. Its answers and the other
	// admin paths' methods are ztunnel's (issue 34).
	locked := dp.cluster.Daemons["locked"]
	for _, c := range []struct {
		post       bool
		path, body string
		code       int
	}{
		{false, "/quitquitquit", "", 405},
		{false, "/logging", "Invalid HTTP method", 405},
		{true, "/logging", "current log level is", 200},
		{false, "/debug/pprof/heap/profiling", "heap profiling active: true\n", 200},
		{false, "/debug/pprof/profile?seconds=0", "invalid seconds value; expected 1-300\n", 400},
		{false, "/unknown", "", 404},
	} {
		get := locked.Get
		if c.post {
			get = locked.Post
		}
		code, body, err := get(ctx, "http://127.0.0.1:15000"+c.path)
		if err != nil || code != c.code || !strings.HasPrefix(string(body), c.body) || (c.body == "" && len(body) > 0) {
			t.Errorf("%s: %d %q %v, want %d %q", c.path, code, body, err, c.code, c.body)
		}
	}
	if code, body, err := locked.Post(ctx, "http://127.0.0.1:15000/quitquitquit"); err != nil || code != 200 || string(body) != "shutdown now\n" {
		t.Fatalf("POST /quitquitquit: %d %q %v, want 200 \"shutdown now\"", code, body, err)
	}
	if err := locked.Wait(ctx); err != nil {
		t.Fatalf("daemon exit after /quitquitquit: %v, want status 0", err)
	}
}

// drainDeadline is the termination deadline of the drain tests that must
// end before it: long enough that an exit near it cannot pass for one
// caused by the last connection closing.
const drainDeadline = 30 * time.Second

// TestDrainEndsWithLastConnection is ztunnel's test_shutdown_drain (row 36
// of docs/ztunnel-scenarios.md): once shutdown starts, a daemon with a
// proxied connection open stays up and the connection keeps working; when
// it closes the daemon exits 0 within a second, long before the deadline.
// Meanwhile its admin, metrics and readiness servers refuse connections.
// Run on both daemons of a SOCKS5 connection to an HBONE workload: the
// client's (its SOCKS5 relay) and the destination's (its HBONE inbound, with
// the client daemon's pooled HBONE connection still open to it).
func TestDrainEndsWithLastConnection(t *testing.T) {
	for _, tc := range []struct{ name, daemon string }{
		{"socks5 client's daemon", "source"},
		{"destination's daemon", "hbone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dl := startDirectLab(t, "", "CONNECTION_TERMINATION_DEADLINE="+drainDeadline.String(), noRaceExitSleep())
			d := dl.c.Daemons[tc.daemon]
			ctx, cancel := context.WithTimeout(context.Background(), 2*drainDeadline)
			defer cancel()
			conn := dl.socks5Connect(ctx, t, socks5.Target{Addr: netip.MustParseAddrPort("10.244.0.3:8080")})
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(2 * drainDeadline))
			readWriteStream(t, conn)

			if err := d.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if _, err := d.WaitLog(ctx, "draining"); err != nil {
				t.Fatal(err)
			}
			// Still up: the held connection goes on working.
			readWriteStream(t, conn)
			readWriteStream(t, conn)
			select {
			case <-d.Exited():
				t.Fatal("the daemon exited with a connection open")
			default:
			}
			// But not ready: as ztunnel's, the admin, metrics and
			// readiness servers stopped accepting when the drain began.
			for _, url := range []string{"http://127.0.0.1:15021/healthz/ready", "http://127.0.0.1:15020/metrics", "http://127.0.0.1:15000/config_dump"} {
				if code, _, err := d.Get(ctx, url); err == nil {
					t.Errorf("GET %s during the drain: %d, want the connection refused", url, code)
				}
			}

			conn.Close()
			closed := time.Now()
			wctx, wcancel := context.WithTimeout(ctx, drainDeadline/2)
			defer wcancel()
			if err := d.Wait(wctx); err != nil {
				// What it waits for: its goroutines, which SIGQUIT has
				// the Go runtime print to the log (the admin server is
				// closed during a drain).
				_ = d.Signal(syscall.SIGQUIT)
				qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = d.Wait(qctx)
				qcancel()
				t.Logf("log of the daemon that did not exit, goroutines at its end:\n%s", d.Log())
				t.Fatalf("daemon exit after the last connection closed: %v, want status 0", err)
			}
			if took := time.Since(closed); took > time.Second {
				t.Errorf("the daemon exited %v after its last connection closed, want within 1s", took)
			}
			if !strings.Contains(d.Log(), "drain complete") {
				t.Error("no drain complete in the log")
			}
		})
	}
}

// noRaceExitSleep is the GORACE setting that stops a -race daemon from
// sleeping a second at exit (the race runtime's atexit_sleep_ms), which
// would hide how soon it exits.
func noRaceExitSleep() string {
	return "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// drainSharedConfig: client and server pods on one node, one shared-mode
// daemon for both (ztunnel's test_ztunnel_shutdown layout).
const drainSharedConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: node-a
  services: {}
`

// TestDrainShared is ztunnel's test_ztunnel_shutdown (row 17): in shared
// mode, a connection between two pods of the node, held open, keeps
// working after the node's daemon begins its shutdown; once it closes, new
// connections fail within 2s. The daemon exits 0, before its deadline.
func TestDrainShared(t *testing.T) {
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, drainSharedConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
		DaemonEnv: []string{"CONNECTION_TERMINATION_DEADLINE=" + drainDeadline.String(), noRaceExitSleep()},
	})
	srv := startEcho(t, c.Pods["server"], 8080)
	d := c.Daemons["node-a"]
	client := c.Pods["client"]

	held, err := client.Dial(ctx, "tcp", srv.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := nettest.RoundTrip(held, "before shutdown"); err != nil {
		t.Fatal(err)
	}
	// Through the daemon: the server saw the client pod's address over
	// HBONE (the capture sends nothing else to the app's port).
	if peers := srv.Peers(); len(peers) != 1 || peers[0].Addr() != client.IP {
		t.Fatalf("server peers %v, want one from %s", peers, client.IP)
	}
	if err := d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WaitLog(ctx, "draining"); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"during shutdown", "still during shutdown"} {
		if err := nettest.RoundTrip(held, msg); err != nil {
			t.Fatalf("held connection after shutdown began: %v", err)
		}
	}
	held.Close()
	closed := time.Now()
	// It went through the daemon, over HBONE between the two pods.
	if _, err := d.WaitLog(ctx, "connection complete", `direction="outbound"`, `dst.workload="server"`, `dst.hbone_addr="10.244.0.3:8080"`); err != nil {
		t.Fatal(err)
	}

	// New connections fail within 2s (ztunnel's assert_eventually).
	fctx, fcancel := context.WithDeadline(ctx, closed.Add(2*time.Second))
	defer fcancel()
	newFails := func() bool {
		dctx, dcancel := context.WithTimeout(fctx, 500*time.Millisecond)
		defer dcancel()
		conn, err := client.Dial(dctx, "tcp", srv.Addr.String())
		if err != nil {
			return true
		}
		defer conn.Close()
		return nettest.RoundTrip(conn, "after shutdown") != nil
	}
	if !pollUntil(fctx, newFails) {
		t.Fatalf("new connections still work %v after the held one closed", time.Since(closed))
	}
	wctx, wcancel := context.WithTimeout(ctx, drainDeadline/2)
	defer wcancel()
	if err := d.Wait(wctx); err != nil {
		t.Fatalf("daemon exit: %v, want status 0 before the %v deadline", err, drainDeadline)
	}
}
