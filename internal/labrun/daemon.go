package labrun

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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// DaemonOptions start one daemon.
type DaemonOptions struct {
	// Binary is the ztunnel executable.
	Binary string
	// ConfigPath is the LOCAL_XDS_PATH file.
	ConfigPath string
	// CACert and CAKey are the shared built-in CA's PEM files.
	CACert, CAKey string
	// Workload is "namespace/name/service-account" (PROXY_WORKLOAD_INFO).
	Workload string
	// Env adds or overrides environment variables.
	Env []string
	// LogLevel is RUST_LOG (default "info").
	LogLevel string
	// NoWait returns as soon as the process runs, without waiting for
	// readiness (for a daemon that is meant not to be ready yet).
	NoWait bool
	// ReadOnlyProcSys runs the daemon with /proc/sys mounted read-only, as
	// in a non-privileged Kubernetes container (procsys.go).
	ReadOnlyProcSys bool
	// NoFile, when not zero, runs the daemon with RLIMIT_NOFILE of NoFile
	// from its first instruction on, as a container's tight limit would:
	// both the soft and the hard limit, since the Go runtime raises the
	// soft one to the hard one at start (prlimit from util-linux).
	NoFile uint64
}

// Daemon is one running ztunnel-go process inside a pod's namespace.
type Daemon struct {
	Pod *netnslab.Pod
	cmd *exec.Cmd

	mu  sync.Mutex // guards log
	log bytes.Buffer

	exited chan struct{}
	err    error
}

// StartDaemon runs the daemon in pod's namespace in dedicated mode with the
// capture mark, and waits until /healthz/ready answers 200.
func StartDaemon(ctx context.Context, pod *netnslab.Pod, o DaemonOptions) (*Daemon, error) {
	level := o.LogLevel
	if level == "" {
		level = "info"
	}
	d := &Daemon{Pod: pod, exited: make(chan struct{})}
	// The process outlives ctx on purpose: Stop ends it.
	cmd := pod.Command(context.WithoutCancel(ctx), o.Binary, "proxy", "ztunnel")
	cmd.Env = append(os.Environ(),
		"PROXY_MODE=dedicated",
		"PROXY_WORKLOAD_INFO="+o.Workload,
		"LOCAL_XDS_PATH="+o.ConfigPath,
		"BUILTIN_CA_CERT="+o.CACert,
		"BUILTIN_CA_KEY="+o.CAKey,
		"PACKET_MARK=1337",
		"RUST_LOG="+level,
		"CONNECTION_TERMINATION_DEADLINE=2s",
	)
	cmd.Env = append(cmd.Env, o.Env...)
	if o.ReadOnlyProcSys {
		readOnlyProcSys(cmd) // procsys.go
	}
	if o.NoFile != 0 {
		limitNoFile(cmd, o.NoFile)
	}
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("labrun: start daemon in %s: %w", pod.Name, err)
	}
	d.cmd = cmd
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.log.Write(sc.Bytes())
			d.log.WriteByte('\n')
			d.mu.Unlock()
		}
	}()
	go func() {
		d.err = cmd.Wait()
		pw.Close()
		close(d.exited)
	}()
	if o.NoWait {
		return d, nil
	}
	if err := d.waitReady(ctx, 20*time.Second); err != nil {
		d.Stop()
		return nil, fmt.Errorf("labrun: daemon in %s not ready: %w\n%s", pod.Name, err, d.Log())
	}
	return d, nil
}

// limitNoFile makes cmd run under prlimit with RLIMIT_NOFILE set to limit
// (soft and hard). prlimit and `ip netns exec` exec in place, so the
// process started is the daemon itself (PID).
func limitNoFile(cmd *exec.Cmd, limit uint64) {
	path, err := exec.LookPath("prlimit")
	if err != nil {
		cmd.Err = err
		return
	}
	cmd.Args = append([]string{"prlimit", fmt.Sprintf("--nofile=%d:%d", limit, limit), "--"}, cmd.Args...)
	cmd.Path = path
}

// WaitReady waits until /healthz/ready answers 200 (for a daemon started
// with NoWait).
func (d *Daemon) WaitReady(ctx context.Context, timeout time.Duration) error {
	return d.waitReady(ctx, timeout)
}

// Get fetches url from inside the daemon's namespace (for the admin and
// readiness endpoints on loopback).
func (d *Daemon) Get(ctx context.Context, url string) (int, []byte, error) {
	return d.do(ctx, http.MethodGet, url)
}

// Post sends an empty POST to url from inside the daemon's namespace.
func (d *Daemon) Post(ctx context.Context, url string) (int, []byte, error) {
	return d.do(ctx, http.MethodPost, url)
}

func (d *Daemon) do(ctx context.Context, method, url string) (int, []byte, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.Pod.Dial(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (d *Daemon) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		select {
		case <-d.exited:
			return fmt.Errorf("daemon exited: %v", d.err)
		default:
		}
		code, body, err := d.Get(ctx, "http://127.0.0.1:15021/healthz/ready")
		if err == nil && code == http.StatusOK {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("status %d: %s", code, strings.TrimSpace(string(body)))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-d.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Log returns everything the daemon has written so far.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// WaitLog waits until the daemon's log holds a line containing every one of
// parts, and returns that line.
func (d *Daemon) WaitLog(ctx context.Context, parts ...string) (string, error) {
	for {
		for _, line := range strings.Split(d.Log(), "\n") {
			ok := true
			for _, p := range parts {
				if !strings.Contains(line, p) {
					ok = false
					break
				}
			}
			if ok && line != "" {
				return line, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no log line with %q in daemon %s: %w", parts, d.Pod.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Signal sends sig to the daemon without waiting.
func (d *Daemon) Signal(sig os.Signal) error { return d.cmd.Process.Signal(sig) }

// Exited is closed once the daemon has exited.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// Wait waits for the daemon to exit (or ctx) and returns its exit error.
func (d *Daemon) Wait(ctx context.Context) error {
	select {
	case <-d.exited:
		return d.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop sends SIGTERM (graceful drain) and waits for the exit, killing the
// process if it takes longer than 10s. It returns the exit error, if any.
func (d *Daemon) Stop() error {
	if d.cmd.Process == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return errors.New("labrun: daemon did not exit within 10s of SIGTERM")
	}
	return d.err
}
