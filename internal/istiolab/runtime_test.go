//go:build istiolab

package istiolab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// labRuntime is RunRuntime running for a test over its nodes' istio-cni,
// with what it started and logged.
type labRuntime struct {
	mu   sync.Mutex
	pods map[string]*netnslab.Pod // started and not stopped, by namespace/name
	log  []string
}

// startRuntime runs the lab's runtime over cnis until the test ends.
func startRuntime(t *testing.T, cp *ControlPlane, cnis ...*CNI) *labRuntime {
	t.Helper()
	rt := &labRuntime{pods: make(map[string]*netnslab.Pod)}
	byNode := make(map[string]*CNI, len(cnis))
	for _, c := range cnis {
		byNode[c.Node.Name] = c
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cp.RunRuntime(ctx, RuntimeOptions{
			CNIs:     byNode,
			Interval: 250 * time.Millisecond,
			Started: func(namespace, name string, pod *netnslab.Pod) {
				rt.mu.Lock()
				defer rt.mu.Unlock()
				rt.pods[namespace+"/"+name] = pod
			},
			Stopped: func(namespace, name string) {
				rt.mu.Lock()
				defer rt.mu.Unlock()
				delete(rt.pods, namespace+"/"+name)
			},
			Logf: func(format string, args ...any) {
				rt.mu.Lock()
				defer rt.mu.Unlock()
				rt.log = append(rt.log, fmt.Sprintf(format, args...))
			},
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("--- the runtime's log ---\n%s", strings.Join(rt.log, "\n"))
		}
	})
	return rt
}

// pod returns the started pod namespace/name.
func (rt *labRuntime) pod(key string) (*netnslab.Pod, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	p, ok := rt.pods[key]
	return p, ok
}

// waitPod waits for the runtime to start namespace/name.
func (rt *labRuntime) waitPod(t *testing.T, key string) *netnslab.Pod {
	t.Helper()
	var pod *netnslab.Pod
	waitUntil(t, time.Minute, func() error {
		var ok bool
		if pod, ok = rt.pod(key); !ok {
			return fmt.Errorf("the runtime has not started %s", key)
		}
		return nil
	})
	return pod
}

// logged reports whether the runtime logged a line holding s.
func (rt *labRuntime) logged(s string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, line := range rt.log {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// TestPodDeletion deletes a pod started by the runtime as kubectl deletes
// one (its default grace period): the runtime, as a kubelet, stops its
// sandbox (CNI DEL of istio-cni's plugin, its process and pod-UID cgroup,
// its network namespace) and deletes the object with grace 0; istio-cni's
// agent sees the pod go and sends the daemon DelWorkload, so the daemon
// drops the pod (its log, and its count of running proxies).
func TestPodDeletion(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	cni, z := startMeshNode(t, cp, lab, "node1", ztunnelBinary(t), nil)
	rt := startRuntime(t, cp, cni)
	if _, err := cp.Kubectl(ctx, demoNamespaceYAML+`---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: demo
spec:
  serviceAccountName: server
  containers:
  - name: app
    image: istiolab.invalid/app
`, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	pod := rt.waitPod(t, "demo/server")
	out, err := cp.Kubectl(ctx, "", "get", "pod", "server", "-n", "demo", "-o", "jsonpath={.metadata.uid}")
	if err != nil {
		t.Fatal(err)
	}
	uid := strings.TrimSpace(string(out))
	waitUntil(t, time.Minute, func() error {
		if logLineWith(z.Log(), "pod received, starting proxy", uid) == "" {
			return fmt.Errorf("the daemon was not handed pod %s", uid)
		}
		return proxyCount(ctx, z, 1)
	})
	cgroups, err := filepath.Glob(filepath.Join(cgroupBase(), "istiolab-*", "kubepods", "besteffort", "pod"+uid))
	if err != nil || len(cgroups) != 1 {
		t.Fatalf("the pod's cgroup: %v (%v)", cgroups, err)
	}

	start := time.Now()
	if _, err := cp.Kubectl(ctx, "", "delete", "pod", "server", "-n", "demo", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		out, err := cp.Kubectl(ctx, "", "get", "pod", "server", "-n", "demo", "--ignore-not-found", "-o", "name")
		if err != nil || len(out) != 0 {
			return fmt.Errorf("pod demo/server still there: %q (%v)", out, err)
		}
		return nil
	})
	t.Logf("pod deleted in %v", time.Since(start).Round(100*time.Millisecond))
	if !rt.logged("stopped demo/server on node1") {
		t.Fatalf("the runtime did not stop the pod's sandbox")
	}
	if _, err := os.Stat(filepath.Join("/run/netns", pod.NetNS)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's network namespace %s: %v, want it gone", pod.NetNS, err)
	}
	if _, err := os.Stat(cgroups[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's cgroup %s: %v, want it gone", cgroups[0], err)
	}
	waitUntil(t, time.Minute, func() error {
		if logLineWith(z.Log(), "pod delete request", uid) == "" {
			return fmt.Errorf("the daemon was not told pod %s is gone", uid)
		}
		return proxyCount(ctx, z, 0)
	})
}

// proxyCount checks the daemon's count of pods it runs a proxy for
// (workload_manager_active_proxy_count on its metrics port).
func proxyCount(ctx context.Context, z *Ztunnel, want int) error {
	got, err := metricValue(ctx, z, "workload_manager_active_proxy_count")
	if err != nil {
		return err
	}
	if got != float64(want) {
		return fmt.Errorf("the daemon on %s runs %v proxies, want %d", z.Pod.Node.Name, got, want)
	}
	return nil
}

// metricValue reads an unlabelled metric from the daemon's :15020/metrics.
func metricValue(ctx context.Context, z *Ztunnel, name string) (float64, error) {
	client := &http.Client{
		Transport: &http.Transport{DialContext: z.Pod.Dial, DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15020/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in the daemon's metrics", name)
}
