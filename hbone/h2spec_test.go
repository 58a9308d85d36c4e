package hbone

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/record"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// h2spec (github.com/summerwind/h2spec), the field's HTTP/2 conformance
// suite, written by people who did not write this package, runs against
// our Server on the daemon's transport: mtls/record over TCP, with the
// daemon's own server TLS configuration (mtls.ServerConfig: TLS 1.3, ALPN
// h2, a client certificate required and checked for the trust domain) and
// the daemon's default HTTP/2 settings. h2spec's command has no flag for a
// client certificate, so testdata/h2spec is a small driver around h2spec's
// library, which takes one; the cases and their verdicts are h2spec's.
//
// Every case must pass, but for the few listed in docs/h2spec.md, each with
// the reason it does not apply to a CONNECT-only server; TestH2SpecExcused
// proves each reason. A listed case that starts passing fails the test too,
// so the list stays true.

// envRequireH2Spec makes the h2spec tests fail instead of skipping when
// h2spec cannot be built (no Go toolchain or no module proxy), as does the
// lab's NETNSLAB_REQUIRE=1, which CI sets.
const envRequireH2Spec = "ZTUNNEL_REQUIRE_H2SPEC"

// h2specCases is how many cases h2spec v2.2.1 has with -strict, every
// section: a run that reports fewer did not run them all.
const h2specCases = 146

// h2specCaseTimeout is how long h2spec waits for an answer it expects (its
// default is 2s); cases that pass do not wait for it, so it is a margin for
// a loaded machine, not a timing assertion.
const h2specCaseTimeout = 4 * time.Second

// h2specResult is one line of the driver's output.
type h2specResult struct {
	ID     string `json:"id"`
	Desc   string `json:"desc"`
	Result string `json:"result"` // passed, failed or skipped
	Error  string `json:"error"`
}

// buildH2Spec builds the driver from the module cache (or the module
// proxy) into a temporary directory. It skips the test when that fails,
// unless the environment requires h2spec.
func buildH2Spec(t *testing.T) string {
	t.Helper()
	required := os.Getenv(envRequireH2Spec) == "1" || os.Getenv("NETNSLAB_REQUIRE") == "1"
	if testing.Short() && !required {
		t.Skip("h2spec needs a build from the module proxy; not in -short mode")
	}
	fail := func(format string, args ...any) {
		t.Helper()
		if required {
			t.Fatalf(format, args...)
		}
		t.Skipf(format+"; set "+envRequireH2Spec+"=1 to make this a failure", args...)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		fail("no go command to build h2spec with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "h2spec")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = filepath.Join("testdata", "h2spec")
	// Its own module: no workspace, and its go.sum pins every dependency.
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		fail("building h2spec: %v\n%s", err, out)
	}
	return bin
}

// h2specTarget is our Server on the daemon's transport, on loopback, and
// the client certificate h2spec presents.
type h2specTarget struct {
	port           int
	chain, key     string // PEM files of h2spec's client certificate
	srv            *Server
	handshakeFails chan error
}

func startH2SpecTarget(t *testing.T, cfg Config, h Handler) *h2specTarget {
	t.Helper()
	ca := tlstest.NewCA(t, "cluster.local")
	ours := tlstest.Cert(t, ca, identity.New("cluster.local", "ns-hbone", "sa-hbone"))
	theirs := tlstest.Cert(t, ca, identity.New("cluster.local", "ns-h2spec", "sa-h2spec"))
	dir := t.TempDir()
	cfg = suiteConfig(t, cfg, false)
	tg := &h2specTarget{
		chain: filepath.Join(dir, "chain.pem"), key: filepath.Join(dir, "key.pem"),
		srv: NewServer(cfg, h), handshakeFails: make(chan error, 1),
	}
	tlstest.WriteFiles(t, dir, theirs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg.port = ln.Addr().(*net.TCPAddr).Port
	serverTLS := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return ours, nil })
	wait := serveEach(ln, func(nc net.Conn) {
		// As the daemon's 15008 listener does (proxy.handleHBONE).
		tc := record.Server(nc, serverTLS)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			select {
			case tg.handshakeFails <- err:
			default:
			}
			_ = nc.Close()
			return
		}
		_ = tg.srv.ServeConn(context.Background(), tc)
		_ = tc.Close()
	})
	t.Cleanup(func() {
		_ = ln.Close()
		_ = tg.srv.Close()
		wait()
	})
	return tg
}

// run runs the driver against the target (every case, strict ones
// included, when sections is empty) and returns its results.
func (tg *h2specTarget) run(t *testing.T, bin string, sections ...string) []h2specResult {
	t.Helper()
	out := filepath.Join(t.TempDir(), "results.jsonl")
	args := []string{"-port", strconv.Itoa(tg.port), "-cert", tg.chain, "-key", tg.key,
		"-timeout", h2specCaseTimeout.String(), "-strict", "-out", out}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // hang guard
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, sections...)...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	err := cmd.Run()
	select {
	case herr := <-tg.handshakeFails:
		t.Errorf("TLS handshake with h2spec failed: %v", herr)
	default:
	}
	if err != nil {
		t.Fatalf("h2spec: %v\n%s", err, log.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var results []h2specResult
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r h2specResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("h2spec result %q: %v", sc.Text(), err)
		}
		results = append(results, r)
	}
	return results
}

// excusedH2SpecCases reads the case IDs of docs/h2spec.md's table: rows
// that start with a backquoted h2spec ID.
func excusedH2SpecCases(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "h2spec.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `((?:generic|http2|hpack)/[0-9.]+/[0-9]+)` \\|")
	var ids []string
	for line := range strings.Lines(string(b)) {
		if m := row.FindStringSubmatch(line); m != nil {
			ids = append(ids, m[1])
		}
	}
	if len(ids) == 0 {
		t.Fatal("docs/h2spec.md lists no case")
	}
	return ids
}

// TestH2Spec runs every h2spec case against the server.
func TestH2Spec(t *testing.T) {
	bin := buildH2Spec(t)
	tg := startH2SpecTarget(t, Config{}, echoHandler)
	results := tg.run(t, bin)
	excused := excusedH2SpecCases(t)
	var passed, failedExcused int
	seen := make(map[string]bool)
	for _, r := range results {
		seen[r.ID] = true
		listed := slices.Contains(excused, r.ID)
		switch {
		case r.Result == "passed" && listed:
			t.Errorf("%s now passes (%s): remove it from docs/h2spec.md and TestH2SpecExcused", r.ID, r.Desc)
		case r.Result == "passed":
			passed++
		case listed:
			failedExcused++
			t.Logf("%s %s, excused (docs/h2spec.md): %s", r.ID, r.Result, r.Desc)
		default:
			t.Errorf("%s %s: %s\n%s", r.ID, r.Result, r.Desc, r.Error)
		}
	}
	for _, id := range excused {
		if !seen[id] {
			t.Errorf("docs/h2spec.md lists %s, which h2spec did not run", id)
		}
	}
	if len(results) != h2specCases {
		t.Errorf("h2spec reported %d cases, want all %d", len(results), h2specCases)
	}
	t.Logf("h2spec: %d cases, %d passed, %d excused", len(results), passed, failedExcused)
}
