package harness

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/bench/report"
)

// DescribeMachine collects what the report says about the machine (haproxy,
// if not empty, is the HAProxy binary whose version it names); a piece
// that cannot be read stays empty.
func DescribeMachine(haproxy string) report.Machine {
	m := report.Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.Host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = procField(b, "model name")
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		f := strings.Fields(procField(b, "MemTotal"))
		if len(f) > 0 {
			m.MemTotalKiB, _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(string(out))
	}
	if haproxy != "" {
		if out, err := exec.Command(haproxy, "-v").Output(); err == nil {
			m.HAProxy, _, _ = strings.Cut(string(out), "\n")
		}
	}
	m.LoadStart = LoadAvg()
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			m.Commit += " (with uncommitted changes)"
		}
	}
	return m
}

// LoadAvg reads the 1, 5 and 15 minute load averages.
func LoadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// procField returns the value of the first "key : value" line.
func procField(b []byte, key string) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
