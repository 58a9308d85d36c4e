package istiolab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// process is one upstream program running in a lab namespace, its output in
// a log file (what `zlab istio logs COMPONENT` will show).
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	err     error // set before exited closes
	// inChild says the program is the child of the started process
	// (unshare --fork, which ignores SIGTERM while it waits for its child):
	// stop signals the child.
	inChild bool
	// stopSignal is what stop sends first (zero: SIGTERM).
	stopSignal syscall.Signal
}

// startProcess runs bin with args in ns, with dir as its working directory
// (Istio's programs resolve their "./etc/..." and "./var/run/..." paths
// against it, so nothing lands in the host's /etc or /var/run) and env as
// its whole environment on top of PATH.
func startProcess(ns netnslab.NS, name, dir, logDir, bin string, args, env []string) (*process, error) {
	// The process outlives any caller's context on purpose: stop ends it.
	cmd := ns.Command(context.Background(), bin, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	return startCmd(name, logDir, cmd)
}

// startCmd starts cmd as the component name, its output appended to
// logDir/name.log.
func startCmd(name, logDir string, cmd *exec.Cmd) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("istiolab: %s: %w", name, err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd.Stdout, cmd.Stderr = logf, logf
	// A test binary that dies must not leave an API server behind: the
	// kernel kills the child with its parent (`ip netns exec` execs it, so
	// the signal reaches the program itself).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("istiolab: start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// errExited reports that a component ended before it became ready.
var errExited = errors.New("istiolab: component exited")

// exitErr describes an exited process with the end of its log.
func (p *process) exitErr() error {
	return fmt.Errorf("%w: %s: %v\n%s", errExited, p.name, p.err, p.logTail(30))
}

// logTail returns the last n lines of the process's log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM and waits up to grace for the exit, then kills. Stopping
// a process that already exited returns nil: its end is in its log.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	target := p.cmd.Process.Pid
	if p.inChild {
		if pid, ok := firstChild(target); ok {
			target = pid
		}
	}
	sig := p.stopSignal
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	_ = syscall.Kill(target, sig)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return fmt.Errorf("istiolab: %s did not exit within %v of SIGTERM", p.name, grace)
}

// firstChild returns the first child of process pid.
func firstChild(pid int) (int, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, false
	}
	child, err := strconv.Atoi(f[0])
	return child, err == nil
}
