//go:build istiolab

package istiolab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// istioctlYAML is what the istioctl test adds to the traffic mesh: a Service
// for the server and an AuthorizationPolicy selecting it, so each section of
// the daemons' configuration has an entry istiod made.
const istioctlYAML = `apiVersion: v1
kind: Service
metadata:
  name: server
  namespace: demo
spec:
  selector:
    app: server
  ports:
  - name: tcp-echo
    port: 80
    targetPort: 8080
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-client
  namespace: demo
spec:
  selector:
    matchLabels:
      app: server
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/demo/sa/client"]
    to:
    - operation:
        ports: ["8080"]
`

// TestIstioctl runs istioctl's ztunnel commands against the daemons as an
// operator would, each through istioctl built from istiod's Istio.
// istioctl reaches a ztunnel's admin port through the API server's
// port-forward, which needs a kubelet the lab does not have; so, as its
// --file mode allows, each daemon's /config_dump is fetched from its admin
// port (15000, in its pod) and handed to istioctl ztunnel-config
// workload|service|policy|certificate|connections|all, in summary and JSON.
// Every command succeeds and shows the mesh's pods, the Service, the
// policy, the certificates and an open connection as istioctl renders
// ztunnel's; and no field of the daemon's dump is lost in istioctl's
// reading (a field istioctl re-renders empty while the dump has a value is a
// shape istioctl cannot parse). istioctl analyze then runs against the API
// server.
func TestIstioctl(t *testing.T) {
	m := startTrafficMesh(t)
	ctx := t.Context()
	if _, err := m.cp.Kubectl(ctx, istioctlYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	// A connection held open from the far client, for the connections view.
	conn, err := m.clients[1].Dial(ctx, "tcp", m.dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	istioctl := func(args ...string) string {
		t.Helper()
		out, err := m.cp.Istioctl(ctx, "", args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for i, z := range m.ztunnels {
		node := fmt.Sprintf("node%d", i+1)
		file := filepath.Join(dir, z.Name+".json")
		// The dump once istiod's Service and policy reached this daemon.
		var raw []byte
		waitUntil(t, time.Minute, func() error {
			var err error
			if raw, err = fetchConfigDump(ctx, z.Pod); err != nil {
				return err
			}
			s := string(raw)
			if !strings.Contains(s, `"server.demo.svc.cluster.local"`) || !strings.Contains(s, `"allow-client"`) {
				return fmt.Errorf("%s's /config_dump has not the Service and the policy yet", z.Name)
			}
			return nil
		})
		if err := os.WriteFile(file, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		var dump map[string]json.RawMessage
		if err := json.Unmarshal(raw, &dump); err != nil {
			t.Fatal(err)
		}

		// Workloads: every pod of the mesh, on its node, over HBONE.
		out := istioctl("ztunnel-config", "workload", "-f", file)
		t.Logf("istioctl zc workload (%s):\n%s", z.Name, out)
		for _, p := range []struct {
			pod  *netnslab.Pod
			node string
		}{{m.server, "node1"}, {m.clients[0], "node1"}, {m.clients[1], "node2"}} {
			if !hasRow(out, "demo", p.pod.Name, p.pod.IP.String(), p.node, "None", "HBONE") {
				t.Errorf("%s: istioctl zc workload shows no row for demo/%s %s on %s over HBONE", z.Name, p.pod.Name, p.pod.IP, p.node)
			}
		}
		if out := istioctl("ztunnel-config", "workload", "-f", file, "--workload-node", node); !hasRow(out, m.clients[i].Name) {
			t.Errorf("%s: istioctl zc workload --workload-node %s lacks %s:\n%s", z.Name, node, m.clients[i].Name, out)
		}
		compareParsed(t, z.Name+" workloads", dump["workloads"], istioctl("ztunnel-config", "workload", "-f", file, "-o", "json"), "uid",
			"uid", "workloadIps", "protocol", "name", "namespace", "serviceAccount", "workloadName", "workloadType",
			"canonicalName", "canonicalRevision", "clusterId", "trustDomain", "node", "status")

		// Services: the Service with its VIP and its one healthy endpoint.
		out = istioctl("ztunnel-config", "service", "-f", file)
		t.Logf("istioctl zc service (%s):\n%s", z.Name, out)
		if !hasRow(out, "demo", "server", "None", "1/1") {
			t.Errorf("%s: istioctl zc service shows no row for demo/server with 1/1 endpoints", z.Name)
		}
		compareParsed(t, z.Name+" services", dump["services"], istioctl("ztunnel-config", "service", "-f", file, "-o", "json"), "hostname",
			"name", "namespace", "hostname", "vips", "ports", "endpoints", "ipFamilies")

		// Policies: istiod's conversion of the AuthorizationPolicy.
		out = istioctl("ztunnel-config", "policy", "-f", file)
		t.Logf("istioctl zc policy (%s):\n%s", z.Name, out)
		if !hasRow(out, "demo", "allow-client", "Allow", "WorkloadSelector") {
			t.Errorf("%s: istioctl zc policy shows no row for demo/allow-client, Allow, WorkloadSelector", z.Name)
		}
		pjson := istioctl("ztunnel-config", "policy", "-f", file, "-o", "json")
		compareParsed(t, z.Name+" policies", dump["policies"], pjson, "name", "name", "namespace", "scope", "action", "rules")
		if !strings.Contains(pjson, `"Exact": "spiffe://cluster.local/ns/demo/sa/client"`) && !strings.Contains(pjson, `"cluster.local/ns/demo/sa/client"`) {
			t.Errorf("%s: istioctl zc policy -o json does not show the rule's principal:\n%s", z.Name, pjson)
		}

		// Certificates: the node's pods' identities and the daemon's own,
		// each a valid leaf and root.
		out = istioctl("ztunnel-config", "certificate", "-f", file)
		t.Logf("istioctl zc certificate (%s):\n%s", z.Name, out)
		ids := []string{"spiffe://cluster.local/ns/demo/sa/client"}
		if i == 0 {
			ids = append(ids, "spiffe://cluster.local/ns/demo/sa/server")
		}
		for _, id := range ids {
			for _, typ := range []string{"Leaf", "Root"} {
				if !hasRow(out, id, typ, "Available", "true") {
					t.Errorf("%s: istioctl zc certificate shows no valid, available %s for %s", z.Name, typ, id)
				}
			}
		}
		compareParsed(t, z.Name+" certificates", dump["certificates"], istioctl("ztunnel-config", "certificate", "-f", file, "-o", "json"), "identity",
			"identity", "state", "certChain", "rootCerts")

		// Connections: the far client's open connection, outbound on
		// node2 and inbound on node1, named through the dump's workloads.
		out = istioctl("ztunnel-config", "connections", "-f", file)
		t.Logf("istioctl zc connections (%s):\n%s", z.Name, out)
		want := []string{"server.demo", "Inbound", "client-far.demo", "HBONE"}
		if i == 1 {
			want = []string{"client-far.demo", "Outbound", "server.demo", "HBONE"}
		}
		if !hasRow(out, want...) {
			t.Errorf("%s: istioctl zc connections shows no row with %q", z.Name, want)
		}
		if out := istioctl("ztunnel-config", "connections", "-f", file, "-o", "json"); !strings.Contains(out, `"client-far"`) && i == 1 {
			t.Errorf("%s: istioctl zc connections -o json lacks client-far:\n%s", z.Name, out)
		}

		// All of it: the summary has each section; the JSON is the dump.
		out = istioctl("ztunnel-config", "all", "-f", file, "--with-headers")
		for _, s := range []string{"NAMESPACE", "POD NAME", "SERVICE NAME", "POLICY NAME", "CERTIFICATE NAME", "allow-client", "server"} {
			if !strings.Contains(out, s) {
				t.Errorf("%s: istioctl zc all --with-headers lacks %q:\n%s", z.Name, s, out)
			}
		}
		var all map[string]json.RawMessage
		if err := json.Unmarshal([]byte(istioctl("ztunnel-config", "all", "-f", file, "-o", "json")), &all); err != nil {
			t.Errorf("%s: istioctl zc all -o json: %v", z.Name, err)
		}
		for _, k := range []string{"workloads", "services", "policies", "certificates", "workloadState"} {
			if len(all[k]) == 0 || string(all[k]) == "null" {
				t.Errorf("%s: istioctl zc all -o json has no %s", z.Name, k)
			}
		}
	}

	// Against the API server: analyze reads the cluster's Istio objects,
	// precheck what an install or upgrade would meet.
	for _, args := range [][]string{{"analyze", "--all-namespaces"}, {"x", "precheck"}} {
		out, err := m.cp.Istioctl(ctx, "", args...)
		t.Logf("istioctl %s: %v\n%s", strings.Join(args, " "), err, out)
		if err != nil {
			t.Errorf("istioctl %s: %v", strings.Join(args, " "), err)
		}
	}
}

// fetchConfigDump reads the daemon's /config_dump on its admin port in pod.
func fetchConfigDump(ctx context.Context, pod *netnslab.Pod) ([]byte, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: pod.Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15000/config_dump", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("config_dump: %s", resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// hasRow reports whether a line of a tabular output holds every field.
func hasRow(out string, fields ...string) bool {
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		ok := true
		for _, want := range fields {
			found := false
			for _, got := range f {
				if got == want || strings.HasPrefix(got, want+":") || strings.HasPrefix(got, want+"/") {
					found = true
					break
				}
			}
			if !found {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// compareParsed checks istioctl's JSON rendering of a section (the entries
// as it parsed them) against the daemon's own: every entry is there (matched
// by key), each required field has a value, and no field the daemon's entry
// has a value for comes out empty (a shape istioctl cannot read).
func compareParsed(t *testing.T, what string, raw json.RawMessage, parsed, key string, required ...string) {
	t.Helper()
	ours, err := entries(raw)
	if err != nil {
		t.Fatalf("%s: the daemon's dump: %v", what, err)
	}
	var theirs []map[string]any
	if err := json.Unmarshal([]byte(parsed), &theirs); err != nil {
		t.Fatalf("%s: istioctl's JSON: %v\n%s", what, err, parsed)
	}
	if len(theirs) != len(ours) || len(ours) == 0 {
		t.Errorf("%s: istioctl shows %d entries, the daemon's dump has %d", what, len(theirs), len(ours))
	}
	byKey := map[string]map[string]any{}
	for _, o := range ours {
		byKey[fmt.Sprint(o[key])] = o
	}
	for _, e := range theirs {
		k := fmt.Sprint(e[key])
		o, ok := byKey[k]
		if !ok {
			t.Errorf("%s: istioctl shows %s=%s, which the daemon's dump lacks", what, key, k)
			continue
		}
		for _, f := range required {
			// Workloads of the API server's EndpointSlice are no pods: no
			// node, workload name or canonical labels, in ztunnel's dump too.
			if e["namespace"] == "default" && (f == "node" || f == "workloadName" || strings.HasPrefix(f, "canonical")) {
				continue
			}
			if isEmpty(e[f]) {
				t.Errorf("%s %s: istioctl shows %q empty (the daemon's dump: %v)", what, k, f, o[f])
			}
		}
		for f, v := range e {
			if isEmpty(v) && !isEmpty(o[f]) {
				t.Errorf("%s %s: istioctl reads %q empty, the daemon's dump has %s", what, k, f, jsonOf(o[f]))
			}
		}
	}
}

// entries decodes a dump section, a list or a map of entries (ztunnel's
// shapes, both of which istioctl accepts).
func entries(raw json.RawMessage) ([]map[string]any, error) {
	var list []map[string]any
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var byName map[string]map[string]any
	if err := json.Unmarshal(raw, &byName); err != nil {
		return nil, err
	}
	for _, e := range byName {
		list = append(list, e)
	}
	return list, nil
}

func isEmpty(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String, reflect.Slice, reflect.Map:
		return rv.Len() == 0
	case reflect.Float64:
		return rv.Float() == 0
	case reflect.Bool:
		return !rv.Bool()
	}
	return false
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
