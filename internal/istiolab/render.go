package istiolab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The install, rendered by Helm from Istio's own charts as Istio's docs
// install ambient with Helm (base, istiod, cni and ztunnel, each with
// --set profile=ambient). The lab applies the objects its programs read and
// takes the programs' arguments and environment from the rendered workloads,
// resolving what a kubelet resolves (the Downward API, envFrom).

// helmRelease is one `helm install` of Istio's ambient Helm guide: its
// release name, the chart (as `make istio-bins` copied it) and the values
// the lab sets beyond the ambient profile.
type helmRelease struct {
	release, chart string
	values         []string
}

// helmReleases are the charts in install order. The values beyond the
// profile are the lab's (docs/istio-lab.md lists them):
// ambient.shareHostNetworkNamespace for istio-cni, whose agent runs in the
// lab node's network namespace (/host/proc/1 is the host's, not the node's).
var helmReleases = []helmRelease{
	{release: "istio-base", chart: "base"},
	{release: "istiod", chart: "istio-discovery"},
	{release: "istio-cni", chart: "istio-cni", values: []string{"ambient.shareHostNetworkNamespace=true"}},
	{release: "ztunnel", chart: "ztunnel"},
}

// installKinds are the kinds of rendered object the lab applies. Left out:
// the CRDs (applied before, from the same module's crd-all.gen.yaml), the
// istiod Deployment (kube-controller-manager would make pods of it that no
// image runs; the lab runs istiod itself, from the Deployment's container),
// the istiod Service (no pod backs it, so no endpoint: the lab names istiod
// by address), the webhooks (the API server would call istiod through that
// Service), the HorizontalPodAutoscaler, PodDisruptionBudget and
// NetworkPolicies (nothing enforces them here). The DaemonSets are applied:
// no DaemonSet controller runs (the lab starts their pods itself), and
// istio-cni's agent reads its own on SIGTERM.
var installKinds = map[string]bool{
	"ServiceAccount": true, "ConfigMap": true,
	"ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
	"DaemonSet": true,
}

// object is one decoded Kubernetes object.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }

func (o object) name() string {
	m, _ := o["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}

// rendered is the whole install as Helm rendered it.
type rendered struct {
	objects []object
}

// renderInstall runs helm template over each chart of helmReleases in
// namespace IstioNamespace, with Istio's version as the images' tag (the
// istio-cni agent's CURRENT_AGENT_VERSION comes from it, as in a release).
func (cp *ControlPlane) renderInstall(ctx context.Context) (*rendered, error) {
	version, err := cp.bins.Version("istio")
	if err != nil {
		return nil, err
	}
	home := cp.dir("home")
	r := &rendered{}
	for _, rel := range helmReleases {
		args := []string{"template", rel.release, cp.bins.Chart(rel.chart), "--namespace", IstioNamespace,
			"--set", "profile=ambient", "--set", "global.tag=" + version}
		for _, v := range rel.values {
			args = append(args, "--set", v)
		}
		cmd := exec.CommandContext(ctx, cp.bins.Helm(), args...)
		// Helm's own state (config, cache, data) in the lab's directory.
		cmd.Env = []string{"HOME=" + home, "HELM_CONFIG_HOME=" + filepath.Join(home, ".config", "helm"),
			"HELM_CACHE_HOME=" + filepath.Join(home, ".cache", "helm"), "HELM_DATA_HOME=" + filepath.Join(home, ".local", "helm")}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("istiolab: helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
		}
		// The rendered text, for whoever reads the lab's directory.
		if err := os.WriteFile(filepath.Join(cp.cfg.Dir, "rendered-"+rel.release+".yaml"), out, 0o600); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		for {
			// Into the plain map type: yaml decodes nested mappings as the
			// type of the outer one, which type assertions below expect.
			var o map[string]any
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("istiolab: helm template %s: %w", rel.chart, err)
			}
			if o != nil {
				r.objects = append(r.objects, object(o))
			}
		}
	}
	return r, nil
}

// installYAML is what the lab applies of the rendered install (installKinds).
func (r *rendered) installYAML() (string, error) {
	var b strings.Builder
	for _, o := range r.objects {
		if !installKinds[o.kind()] {
			continue
		}
		data, err := yaml.Marshal(map[string]any(o))
		if err != nil {
			return "", fmt.Errorf("istiolab: %w", err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return b.String(), nil
}

// find returns the rendered object of kind and name.
func (r *rendered) find(kind, name string) (object, error) {
	for _, o := range r.objects {
		if o.kind() == kind && o.name() == name {
			return o, nil
		}
	}
	return nil, fmt.Errorf("istiolab: the rendered install has no %s %s", kind, name)
}

// podFields are a pod's values the Downward API gives its containers.
type podFields struct {
	name, namespace, node, podIP, hostIP, serviceAccount string
}

// containerSpec returns the arguments and environment of container in the
// pod template of the rendered workload kind/name (Deployment, DaemonSet) as
// a kubelet would start it for a pod with fields f: command and args as
// written, envFrom ConfigMaps from the rendered ConfigMaps (what the lab
// applied), env in order with valueFrom resolved (fieldRef,
// resourceFieldRef against the container's resources or, without a limit,
// the node's allocatable: this machine's CPUs and memory).
func (r *rendered) containerSpec(kind, name, container string, f podFields) (args, env []string, err error) {
	w, err := r.find(kind, name)
	if err != nil {
		return nil, nil, err
	}
	c, err := podContainer(w, container)
	if err != nil {
		return nil, nil, err
	}
	args = append(stringList(c["command"]), stringList(c["args"])...)
	if len(args) > 0 && c["command"] != nil {
		args = args[1:] // the program itself: the lab names its binary
	}
	for _, ef := range list(c["envFrom"]) {
		ref, _ := ef["configMapRef"].(map[string]any)
		cmName, _ := ref["name"].(string)
		if cmName == "" {
			return nil, nil, fmt.Errorf("istiolab: %s %s: envFrom other than configMapRef", kind, name)
		}
		cm, err := r.find("ConfigMap", cmName)
		if err != nil {
			return nil, nil, err
		}
		data, _ := cm["data"].(map[string]any)
		for _, k := range sortedKeys(data) {
			env = append(env, k+"="+fmt.Sprint(data[k]))
		}
	}
	resources, _ := c["resources"].(map[string]any)
	for _, e := range list(c["env"]) {
		n, _ := e["name"].(string)
		if v, ok := e["value"]; ok {
			env = append(env, n+"="+fmt.Sprint(v))
			continue
		}
		from, _ := e["valueFrom"].(map[string]any)
		v, err := resolveValueFrom(from, f, resources)
		if err != nil {
			return nil, nil, fmt.Errorf("istiolab: %s %s env %s: %w", kind, name, n, err)
		}
		env = append(env, n+"="+v)
	}
	return args, env, nil
}

// podMeta returns the labels and annotations of the pod template of the
// rendered workload kind/name: what its controller gives each pod.
func (r *rendered) podMeta(kind, name string) (labels, annotations map[string]string, err error) {
	w, err := r.find(kind, name)
	if err != nil {
		return nil, nil, err
	}
	spec, _ := w["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	meta, _ := tmpl["metadata"].(map[string]any)
	strs := func(v any) map[string]string {
		m, _ := v.(map[string]any)
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[k] = fmt.Sprint(v)
		}
		return out
	}
	return strs(meta["labels"]), strs(meta["annotations"]), nil
}

func podContainer(w object, name string) (map[string]any, error) {
	spec, _ := w["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pspec, _ := tmpl["spec"].(map[string]any)
	for _, c := range list(pspec["containers"]) {
		if c["name"] == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("istiolab: %s %s has no container %s", w.kind(), w.name(), name)
}

// resolveValueFrom is the kubelet's part of an env var's valueFrom.
func resolveValueFrom(from map[string]any, f podFields, resources map[string]any) (string, error) {
	if ref, ok := from["fieldRef"].(map[string]any); ok {
		switch path, _ := ref["fieldPath"].(string); path {
		case "metadata.name":
			return f.name, nil
		case "metadata.namespace":
			return f.namespace, nil
		case "spec.nodeName":
			return f.node, nil
		case "status.podIP":
			return f.podIP, nil
		case "status.hostIP":
			return f.hostIP, nil
		case "spec.serviceAccountName":
			return f.serviceAccount, nil
		default:
			return "", fmt.Errorf("fieldRef %s not resolved by the lab", path)
		}
	}
	if ref, ok := from["resourceFieldRef"].(map[string]any); ok {
		res, _ := ref["resource"].(string)
		divisor := 1.0
		if d, ok := ref["divisor"]; ok {
			var err error
			if divisor, err = parseQuantity(fmt.Sprint(d)); err != nil || divisor == 0 {
				return "", fmt.Errorf("divisor %v", d)
			}
		}
		kind, resource, _ := strings.Cut(res, ".")
		limits, _ := resources["limits"].(map[string]any)
		set, _ := resources[kind].(map[string]any)
		q := set[resource]
		if q == nil && kind == "requests" {
			// An unset request defaults to the limit.
			q = limits[resource]
		}
		var v float64
		if q != nil {
			var err error
			if v, err = parseQuantity(fmt.Sprint(q)); err != nil {
				return "", err
			}
		} else {
			// No limit: the node's allocatable, as the kubelet gives.
			switch resource {
			case "cpu":
				v = float64(runtime.NumCPU())
			case "memory":
				m, err := memTotal()
				if err != nil {
					return "", err
				}
				v = float64(m)
			default:
				return "", fmt.Errorf("resourceFieldRef %s not resolved by the lab", res)
			}
		}
		// The kubelet rounds up to a whole multiple of the divisor.
		return strconv.FormatInt(int64(math.Ceil(v/divisor)), 10), nil
	}
	return "", errors.New("valueFrom not resolved by the lab")
}

// parseQuantity reads the forms of Kubernetes quantity the charts use:
// plain and decimal numbers, the milli suffix and the binary suffixes.
func parseQuantity(s string) (float64, error) {
	mult := 1.0
	for suffix, m := range map[string]float64{"m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "M": 1e6, "G": 1e9} {
		if strings.HasSuffix(s, suffix) {
			mult, s = m, strings.TrimSuffix(s, suffix)
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("quantity %q: %w", s, err)
	}
	return v * mult, nil
}

// memTotal is the machine's memory in bytes (/proc/meminfo).
func memTotal() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}

func list(v any) []map[string]any {
	var out []map[string]any
	for _, e := range asSlice(v) {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func stringList(v any) []string {
	var out []string
	for _, e := range asSlice(v) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// withEnv returns env with each of overrides (NAME=value) replacing the
// variable of that name or appended: the lab's explicit overrides.
func withEnv(env []string, overrides ...string) []string {
	out := slices.Clone(env)
	for _, o := range overrides {
		name, _, _ := strings.Cut(o, "=")
		if i := slices.IndexFunc(out, func(e string) bool { return strings.HasPrefix(e, name+"=") }); i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	return out
}
