package labrun

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// Stats are one reading of a daemon's resources, for tests that check they
// return to their baseline after load.
type Stats struct {
	// RSS is the resident memory (VmRSS) in bytes.
	RSS uint64
	// FDs is the number of open descriptors.
	FDs int
	// Threads is the number of OS threads.
	Threads int
	// Goroutines is the count the daemon's pprof goroutine profile reports.
	Goroutines int
	// HeapInuse and StackInuse are the Go runtime's figures after a
	// collection (the pprof heap profile with gc=1): the live memory, which
	// RSS follows only as the runtime returns pages to the kernel.
	HeapInuse, StackInuse uint64
	// HeapAlloc is the bytes of the heap's objects after that collection:
	// what is live. HeapInuse less HeapAlloc is the free space inside the
	// spans the live objects keep (fragmentation).
	HeapAlloc uint64
}

// String formats the reading for logs.
func (s Stats) String() string {
	return fmt.Sprintf("rss %.1f MiB (heap %.1f, live %.1f, stacks %.1f), %d fds, %d threads, %d goroutines",
		float64(s.RSS)/(1<<20), float64(s.HeapInuse)/(1<<20), float64(s.HeapAlloc)/(1<<20), float64(s.StackInuse)/(1<<20), s.FDs, s.Threads, s.Goroutines)
}

// Stats reads the daemon's resident memory, descriptors and threads from
// /proc and its goroutine count from the admin server's pprof endpoint.
func (d *Daemon) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	pid := d.PID()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.FDs = len(ents)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseUint(f[0], 10, 64)
		switch k {
		case "VmRSS":
			s.RSS = n << 10
		case "Threads":
			s.Threads = int(n)
		}
	}
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/goroutine?debug=1")
	if err != nil {
		return s, err
	}
	if code != 200 {
		return s, fmt.Errorf("labrun: goroutine profile: status %d", code)
	}
	// The first line reads "goroutine profile: total N".
	first, _, _ := bytes.Cut(body, []byte("\n"))
	_, total, ok := strings.Cut(string(first), "total ")
	if !ok {
		return s, fmt.Errorf("labrun: goroutine profile starts with %q", first)
	}
	if s.Goroutines, err = strconv.Atoi(strings.TrimSpace(total)); err != nil {
		return s, fmt.Errorf("labrun: goroutine profile total: %w", err)
	}
	code, body, err = d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		return s, err
	}
	if code != 200 {
		return s, fmt.Errorf("labrun: heap profile: status %d", code)
	}
	// The runtime's MemStats close the text: "# HeapInuse = N", "# Stack = inuse / sys".
	for line := range strings.SplitSeq(string(body), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		n, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "HeapInuse":
			s.HeapInuse = n
		case "HeapAlloc":
			s.HeapAlloc = n
		case "Stack":
			s.StackInuse = n
		}
	}
	return s, nil
}

// CPUTime returns the user plus system CPU time the daemon has used, from
// /proc/<pid>/stat (for tests that check a loop is not spinning).
func (d *Daemon) CPUTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.PID()))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the whole line.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("labrun: unparsable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("labrun: short /proc stat")
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, nil
}

// SetNoFile changes the daemon's soft RLIMIT_NOFILE while it runs, as a
// tight container limit would: fault tests lower it to exhaust descriptors.
// The hard limit stays, so RestoreNoFile can put back the limit it returns
// without CAP_SYS_RESOURCE.
func (d *Daemon) SetNoFile(limit uint64) (old unix.Rlimit, err error) {
	if err := unix.Prlimit(d.PID(), unix.RLIMIT_NOFILE, nil, &old); err != nil {
		return old, fmt.Errorf("labrun: reading the daemon's NOFILE limit: %w", err)
	}
	rl := unix.Rlimit{Cur: min(limit, old.Max), Max: old.Max}
	if err := unix.Prlimit(d.PID(), unix.RLIMIT_NOFILE, &rl, nil); err != nil {
		return old, fmt.Errorf("labrun: prlimit NOFILE=%d on the daemon: %w", limit, err)
	}
	return old, nil
}

// RestoreNoFile puts back a limit SetNoFile returned.
func (d *Daemon) RestoreNoFile(old unix.Rlimit) error {
	if err := unix.Prlimit(d.PID(), unix.RLIMIT_NOFILE, &old, nil); err != nil {
		return fmt.Errorf("labrun: restoring the daemon's NOFILE limit: %w", err)
	}
	return nil
}

// Kill ends the daemon with SIGKILL, as a crash or an OOM kill would, and
// waits for it to be gone. Its sockets close with the process.
func (d *Daemon) Kill() error {
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-d.exited
	return nil
}

// Listeners counts the TCP sockets listening on port inside ns's network
// namespace (from its /proc/net/tcp and tcp6), to check for leaked or
// doubled listeners.
func Listeners(ns netnslab.NS, port uint16) (int, error) {
	n := 0
	err := ns.Do(func() error {
		// thread-self: Do has moved this thread, not the whole process.
		for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
			b, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			n += countListening(b, port)
		}
		return nil
	})
	return n, err
}

// countListening counts the LISTEN (state 0A) sockets on port in the text of
// /proc/net/tcp or tcp6.
func countListening(procNetTCP []byte, port uint16) int {
	n := 0
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(procNetTCP))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
			n++
		}
	}
	return n
}
