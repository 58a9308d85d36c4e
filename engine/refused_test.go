package engine

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const refusedChildEnv = "ENGINE_TEST_IOURING_REFUSED"

// TestIOUringRefusedFallsBack runs itself again in a child process whose
// seccomp filter makes io_uring_setup fail with EPERM, as container
// runtimes' default profiles do, and checks the engine falls back to epoll.
func TestIOUringRefusedFallsBack(t *testing.T) {
	if os.Getenv(refusedChildEnv) == "1" {
		refusedChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIOUringRefusedFallsBack$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), refusedChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "io_uring refused as expected") {
		t.Fatalf("child did not run the check:\n%s", out)
	}
}

func refusedChild(t *testing.T) {
	if err := denyIOUringSetup(); err != nil {
		t.Skipf("cannot install a seccomp filter here: %v", err)
	}
	// Asked for by name, io_uring is an error that says why.
	if _, err := New(Config{Backend: BackendUring}); !errors.Is(err, unix.EPERM) {
		t.Fatalf("New(uring) = %v, want an error wrapping EPERM", err)
	}
	// Asked for with Fallback (as the daemon asks for ZTUNNEL_ENGINE), or
	// chosen automatically, it falls back; Fallback says why only when it
	// was asked for.
	for _, backend := range []string{BackendUring, BackendAuto, ""} {
		e, err := New(Config{Backend: backend, Fallback: true})
		if err != nil {
			t.Fatalf("backend %q: %v", backend, err)
		}
		if e.Backend() != BackendEpoll {
			t.Fatalf("backend %q: running %q, want epoll", backend, e.Backend())
		}
		if got := e.Fallback(); (backend == BackendUring) != (got != nil) || (got != nil && !errors.Is(got, unix.EPERM)) {
			t.Fatalf("backend %q: Fallback() = %v", backend, got)
		}
		e.Close()
	}
	t.Log("io_uring refused as expected; fell back to epoll")
}

// denyIOUringSetup installs, for every thread of this process, a seccomp
// filter failing io_uring_setup with EPERM.
func denyIOUringSetup() error {
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_IO_URING_SETUP, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return errno
	}
	return nil
}
