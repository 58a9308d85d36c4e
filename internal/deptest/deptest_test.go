package deptest

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/ztunnel-go/ztunnel"

// allowed lists, for each package of ours, the packages of ours it may import
// (directly). Packages not listed may import nothing of ours. Test files are
// exempt (they may use test kits).
var allowed = map[string][]string{
	"cmd/ztunnel":          {"internal/app"},
	"cmd/zlab":             {"internal/netnslab", "internal/labrun", "internal/istiolab", "identity", "mtls", "mtls/caclient", "state", "state/xdsconv"},
	"internal/app":         {"admin", "engine", "engine/bufpool", "fdbudget", "hbone", "identity", "inpod", "internal/logging", "metrics", "mtls", "mtls/caclient", "dnsproxy", "proxy", "proxy/connmgr", "state", "state/xdsconv", "xdsclient", "controlplane"},
	"internal/labrun":      {"internal/netnslab", "internal/nettest", "identity", "mtls", "mtls/caclient", "state", "state/xdsconv", "hbone", "inpod/zdstest"},
	"inpod":                {"api/zdsapi", "inpod/netns", "metrics"},
	"cmd/zload":            {"bench/load"},
	"bench/load":           {"hbone", "identity", "mtls", "mtls/caclient", "mtls/record"},
	"bench/peers":          {"bench/load", "mtls"},
	"bench/report":         {"bench/load"},
	"bench/harness":        {"bench/load", "bench/report", "internal/netnslab", "internal/labrun"},
	"bench/cmd/zbench":     {"bench/harness", "bench/load", "bench/report"},
	"bench/cmd/zpeer":      {"bench/load", "bench/peers"},
	"inpod/zdstest":        {"api/zdsapi"},
	"proxy":                {"engine", "engine/bufpool", "fdbudget", "hbone", "identity", "metrics", "mtls", "mtls/record", "proxy/connmgr", "proxy/meta", "proxy/proxyproto", "proxy/socks5", "state"},
	"deploy":               {},
	"admin":                {"state", "mtls", "identity"},
	"hbone":                {"engine/bufpool"},
	"hbone/hbonetest":      {"hbone", "mtls/tlstest"},
	"engine/poll":          {},
	"engine/uring":         {},
	"engine/splice":        {"engine/bufpool"},
	"engine/enginetest":    {"engine", "engine/bufpool", "internal/nettest"},
	"proxy/connmgr":        {"state", "identity"},
	"dnsproxy":             {"fdbudget", "state", "metrics"},
	"proxy/socks5":         {},
	"proxy/proxyproto":     {},
	"proxy/meta":           {},
	"metrics":              {},
	"fdbudget":             {},
	"internal/logging":     {},
	"state/xdsconv":        {"state", "identity", "api/workloadapi", "api/securityapi", "xdsclient"},
	"mtls/caclient":        {"mtls", "identity", "api/caapi", "controlplane"},
	"mtls/caclient/catest": {"mtls/caclient", "identity", "api/caapi", "mtls/tlstest", "xdsclient/xdstest"},
	"api/workloadapi":      {},
	"api/securityapi":      {"api/workloadapi"},
	"api/caapi":            {},
	"api/zdsapi":           {},
	"proto/gen":            {},
	"xdsclient":            {"controlplane"},
	"controlplane":         {},
	"xdsclient/xdstest":    {"mtls/tlstest"},
	"mtls/tlstest":         {"mtls", "mtls/caclient", "identity"},
	"mtls":                 {"identity"},
	"mtls/record":          {},
	"engine":               {"engine/bufpool", "engine/poll", "engine/uring", "engine/splice"},
	"state":                {"identity"},
	"e2e":                  {"bench/harness", "bench/report", "internal/labrun", "internal/netnslab", "hbone", "identity", "mtls", "mtls/tlstest", "proxy/proxyproto", "proxy/socks5", "api/workloadapi", "api/securityapi", "mtls/caclient/catest", "state/xdsconv", "xdsclient/xdstest"},
	"internal/istiolab":    {"internal/netnslab"},
	"internal/netnslab":    {"inpod/netns"},
	"inpod/netns":          {},
	"internal/nettest":     {},
	"internal/rawtcp":      {},
	"engine/bufpool":       {},
	"identity":             {},
	"internal/deptest":     {},
	"internal/fuzzseed":    {},
	"internal/tlsinterop":  {},
}

// forbiddenExternal bans heavy or wrong-layer dependencies from the lower
// packages: the data plane must not pull in gRPC/protobuf, and state stays
// free of serialization formats.
var forbiddenExternal = map[string][]string{
	"engine":         {"crypto/tls", "google.golang.org/grpc", "google.golang.org/protobuf"},
	"engine/bufpool": {"crypto/tls", "google.golang.org/grpc"},
	"state":          {"google.golang.org/protobuf", "go.yaml.in/yaml/v3", "google.golang.org/grpc"},
	"xdsclient":      {"github.com/ztunnel-go/ztunnel/state"},
	"identity":       {"crypto/tls", "google.golang.org/grpc"},
	"hbone":          {"google.golang.org/grpc"},
}

type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string
	GoFiles    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImportLayering(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "internal/tools" {
			continue
		}
		allow, known := allowed[rel]
		if !known {
			t.Errorf("package %s has no row in the layering table (internal/deptest); add one and to ARCHITECTURE.md", rel)
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") {
				dep := strings.TrimPrefix(imp, module+"/")
				ok := false
				for _, a := range allow {
					ok = ok || a == dep
				}
				if !ok {
					t.Errorf("%s imports %s, which its layer does not allow", rel, dep)
				}
				continue
			}
			for _, bad := range forbiddenExternal[rel] {
				if imp == bad || strings.HasPrefix(imp, bad+"/") {
					t.Errorf("%s imports %s, which is forbidden in that layer", rel, imp)
				}
			}
		}
	}
}

func TestEveryPackageHasOneDoc(t *testing.T) {
	for _, p := range listPackages(t) {
		docs := 0
		for _, f := range p.GoFiles {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if file.Doc != nil && strings.TrimSpace(file.Doc.Text()) != "" {
				docs++
			}
		}
		if docs != 1 {
			t.Errorf("package %s has %d package doc comments, want exactly 1", p.ImportPath, docs)
		}
	}
}
