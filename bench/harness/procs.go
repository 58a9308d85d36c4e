package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// proc is a process whose cost the harness measures: a daemon, a peer or
// HAProxy.
type proc struct {
	name string
	pid  int
	ns   netnslab.NS
	// pprof is the base URL of its pprof endpoint inside ns ("" if none).
	pprof string
	// daemon marks our daemon (profiled, restarted between idle ramps);
	// pod is its pod.
	daemon bool
	pod    string
}

// child is a process the harness started and must stop.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *tailBuffer
	done chan struct{}
	err  error
}

// startChild runs argv inside ns, bounded by the harness's lifetime
// (SIGKILL if the harness dies).
func startChild(ctx context.Context, ns netnslab.NS, name string, env []string, argv ...string) (*child, error) {
	cmd := ns.Command(context.WithoutCancel(ctx), argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out := &tailBuffer{max: 64 << 10}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// pid is the process's id (ip netns exec execs the command, so it is the
// command's own).
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 3s.
func (c *child) stop() {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(3 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex // guards buf
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// waitListening dials addr from inside ns until it answers, c exits, or
// the timeout passes.
func waitListening(ctx context.Context, ns netnslab.NS, addr string, c *child, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := ns.Dial(dctx, "tcp", addr)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if c != nil && c.exited() {
			return fmt.Errorf("harness: %s exited: %v\n%s", c.name, c.err, c.out)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("harness: %s not listening on %s after %v: %w", nsName(c), addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func nsName(c *child) string {
	if c == nil {
		return "server"
	}
	return c.name
}

// nsGet fetches url from inside ns (for loopback-only endpoints such as the
// daemon's admin server).
func nsGet(ctx context.Context, ns netnslab.NS, url string, limit int64) ([]byte, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("harness: GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// findPid returns the pid of the process running exe inside the named
// network namespace: labrun does not expose its daemons' pids.
func findPid(nsName, exe string) (int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(netnslab.NS{NetNS: nsName}.Path(), &want); err != nil {
		return 0, fmt.Errorf("harness: %w", err)
	}
	abs, err := filepath.Abs(exe)
	if err != nil {
		return 0, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.TrimSuffix(link, " (deleted)") == abs {
			found = append(found, pid)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return 0, fmt.Errorf("harness: no %s process in netns %s", filepath.Base(exe), nsName)
	}
	return 0, fmt.Errorf("harness: %d %s processes in netns %s", len(found), filepath.Base(exe), nsName)
}

// heapStats reads the heap in use and the committed heap (HeapSys minus
// HeapReleased) from a heap profile in text form.
func heapStats(b []byte) (inuse, committed int64, err error) {
	vals := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "# "), " = ")
		if !ok {
			continue
		}
		switch k {
		case "HeapInuse", "HeapSys", "HeapReleased":
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("harness: %s: %w", k, err)
			}
			vals[k] = n
		}
	}
	if len(vals) != 3 {
		return 0, 0, errors.New("harness: no heap statistics in heap profile")
	}
	return vals["HeapInuse"], vals["HeapSys"] - vals["HeapReleased"], nil
}
