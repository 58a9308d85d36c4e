package netns

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// own opens the test's own network namespace: entering it changes nothing,
// so the runner can be tested without a second namespace (still needs
// CAP_SYS_ADMIN for setns).
func own(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	if err := Run(fd, -1, "own", func() error { return nil }); errors.Is(err, unix.EPERM) {
		if os.Getenv("NETNSLAB_REQUIRE") == "1" {
			t.Fatalf("setns needs CAP_SYS_ADMIN: %v", err)
		}
		t.Skipf("setns needs CAP_SYS_ADMIN: %v", err)
	}
	return fd
}

func TestRunReturnsError(t *testing.T) {
	fd := own(t)
	want := errors.New("from fn")
	for _, home := range []int{-1, fd} {
		if err := Run(fd, home, "own", func() error { return want }); err != want {
			t.Errorf("home %d: Run = %v, want fn's error", home, err)
		}
	}
}

func TestRunGoexit(t *testing.T) {
	fd := own(t)
	if err := Run(fd, -1, "own", func() error { runtime.Goexit(); return nil }); !errors.Is(err, ErrGoexit) {
		t.Errorf("Run after Goexit = %v, want ErrGoexit", err)
	}
}

func TestRunPanicReraised(t *testing.T) {
	fd := own(t)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "boom") {
			t.Errorf("recovered %v, want the panic re-raised", r)
		}
	}()
	_ = Run(fd, -1, "own", func() error { panic("boom") })
}

func TestRunBadTarget(t *testing.T) {
	if err := Run(-1, -1, "bad", func() error { return nil }); err == nil || !strings.Contains(err.Error(), "setns into bad") {
		t.Errorf("Run into a bad descriptor = %v", err)
	}
}
