package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
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

	// /quitquitquit drains and exits 0 as well.
	locked := dp.cluster.Daemons["locked"]
	if code, _, err := locked.Get(ctx, "http://127.0.0.1:15000/quitquitquit"); err != nil || code != 405 {
		t.Fatalf("GET /quitquitquit: %d %v, want 405", code, err)
	}
	if code, _, err := locked.Post(ctx, "http://127.0.0.1:15000/quitquitquit"); err != nil || code != 200 {
		t.Fatalf("POST /quitquitquit: %d %v", code, err)
	}
	if err := locked.Wait(ctx); err != nil {
		t.Fatalf("daemon exit after /quitquitquit: %v, want status 0", err)
	}
}
