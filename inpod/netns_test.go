package inpod

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func threadNetnsID(t testing.TB) NetnsID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return NetnsID{Dev: st.Dev, Ino: st.Ino}
}

func TestNetnsRunEntersAndLeaves(t *testing.T) {
	requireRoot(t)
	f := newNetns(t)
	dup, err := os.Open(nsPath(f))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := NewNetns(dup)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	own, err := OpenNetns("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if ns.ID() == own.ID() {
		t.Fatal("new netns has the process's id")
	}

	// Many concurrent runs: each sees the pod's namespace, and no thread is
	// left in it afterwards.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			errs <- ns.Run(func() error {
				if got := threadNetnsID(t); got != ns.ID() {
					return fmt.Errorf("inside Run: netns %v, want %v", got, ns.ID())
				}
				return nil
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for range 64 {
		wg.Go(func() {
			if got := threadNetnsID(t); got != own.ID() {
				t.Errorf("a thread was left in netns %v", got)
			}
		})
	}
	wg.Wait()

	// A listener made inside lives in the pod: reachable there, not here.
	var ln net.Listener
	if err := ns.Run(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		c.Close()
		t.Fatal("a listener created inside the pod netns is reachable from the host netns")
	}

	// Errors and panics come back to the caller.
	want := errors.New("boom")
	if err := ns.Run(func() error { return want }); !errors.Is(err, want) {
		t.Fatalf("Run error = %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "kaboom") {
				t.Fatalf("recovered %v, want the panic", r)
			}
		}()
		ns.Run(func() error { panic("kaboom") })
	}()
}

func TestCheckPrivileges(t *testing.T) {
	requireRoot(t)
	if err := CheckPrivileges(1337); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkNetnsRun is the fixed cost a pod's socket creation pays for
// entering the pod's namespace (per listener, and per dial: every inbound
// connection's dial to the app).
func BenchmarkNetnsRun(b *testing.B) {
	requireRoot(b)
	f := newNetns(b)
	ns, err := OpenNetns(nsPath(f))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	home, err := OpenNetns("/proc/thread-self/ns/net")
	if err != nil {
		b.Fatal(err)
	}
	defer home.Close()
	for _, bc := range []struct {
		name string
		home int
	}{{"manager", home.fd}, {"standalone", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			ns.home = bc.home
			b.ReportAllocs()
			for b.Loop() {
				if err := ns.Run(func() error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
