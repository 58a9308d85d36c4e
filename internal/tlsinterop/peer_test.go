package tlsinterop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// envRequire makes the interop tests fail instead of skipping when the C
// toolchain or a TLS library's headers are missing (as does the lab's
// NETNSLAB_REQUIRE=1, which CI sets).
const envRequire = "ZTUNNEL_REQUIRE_INTEROP"

// peerTimeout bounds one peer process and every wait on it: a hang guard,
// not a timing assertion.
const peerTimeout = 3 * time.Minute

// stack is one foreign TLS implementation.
type stack struct {
	name string
	src  string   // under testdata
	libs []string // linker flags
	// hrrClientGroups makes the peer's client offer a key share only for a
	// group Go's server does not support, so that the server must answer
	// with a HelloRetryRequest; hrrServerGroups makes its server accept only
	// a group Go's client sends no key share for.
	hrrClientGroups, hrrServerGroups string
	// wantGroup is the name the peer reports for the group then chosen.
	hrrClientWant, hrrServerWant string
	// truncation is the event the stack reports for a connection that ends
	// without close_notify.
	truncation string
}

var stacks = []stack{
	{
		name: "openssl", src: "openssl_peer.c", libs: []string{"-lssl", "-lcrypto"},
		hrrClientGroups: "ffdhe2048:X25519", hrrClientWant: "x25519",
		hrrServerGroups: "P-256", hrrServerWant: "secp256r1",
		truncation: "unexpected_eof",
	},
	{
		name: "gnutls", src: "gnutls_peer.c", libs: []string{"-lgnutls"},
		hrrClientGroups: "+GROUP-FFDHE2048:+GROUP-X25519", hrrClientWant: "X25519",
		hrrServerGroups: "+GROUP-SECP256R1", hrrServerWant: "SECP256R1",
		truncation: "premature_termination",
	},
}

// builds holds the peers built by this test binary.
var builds struct {
	once sync.Once
	dir  string
	bins map[string]string
	errs map[string]error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	os.Exit(code)
}

// required reports whether a missing toolchain must fail the tests.
func required() bool {
	return os.Getenv(envRequire) == "1" || os.Getenv("NETNSLAB_REQUIRE") == "1"
}

// peerBin returns st's peer executable, building every peer on first use;
// a peer that cannot be built skips the test, or fails it when required.
func peerBin(t *testing.T, st stack) string {
	t.Helper()
	builds.once.Do(func() {
		builds.bins, builds.errs = map[string]string{}, map[string]error{}
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			for _, s := range stacks {
				builds.errs[s.name] = err
			}
			return
		}
		dir, err := os.MkdirTemp("", "tlsinterop-")
		if err != nil {
			for _, s := range stacks {
				builds.errs[s.name] = err
			}
			return
		}
		builds.dir = dir
		for _, s := range stacks {
			bin := filepath.Join(dir, s.name+"_peer")
			args := append([]string{"-O2", "-Wall", "-o", bin, filepath.Join("testdata", s.src)}, s.libs...)
			if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
				builds.errs[s.name] = fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
				continue
			}
			builds.bins[s.name] = bin
		}
	})
	if bin, ok := builds.bins[st.name]; ok {
		return bin
	}
	err := builds.errs[st.name]
	if required() {
		t.Fatalf("the %s peer is required (%s=1 or NETNSLAB_REQUIRE=1) but cannot be built: %v", st.name, envRequire, err)
	}
	// Counted in make test's skip banner (apt-get install -y gcc libc6-dev
	// libssl-dev libgnutls28-dev, which scripts/deps.sh does as root).
	netnslab.Skip(t, fmt.Sprintf("the %s peer cannot be built (%v): scripts/deps.sh installs gcc, libssl-dev and libgnutls28-dev", st.name, err))
	return ""
}

// certs are both ends' certificates from one test CA; the peer's are
// written as PEM files.
type certs struct {
	ours, theirs *mtls.WorkloadCert
	// theirSAN is the peer's SPIFFE URI, what our client expects.
	theirSAN string
	dir      string
}

func newCerts(t *testing.T) *certs {
	t.Helper()
	ca := tlstest.NewCA(t, "cluster.local")
	theirID := identity.New("cluster.local", "ns-peer", "sa-peer")
	c := &certs{
		ours:     tlstest.Cert(t, ca, identity.New("cluster.local", "ns-go", "sa-go")),
		theirs:   tlstest.Cert(t, ca, theirID),
		theirSAN: theirID.String(),
		dir:      t.TempDir(),
	}
	tlstest.WriteFiles(t, c.dir, c.theirs)
	return c
}

// peer is one running peer process.
type peer struct {
	name string
	cmd  *exec.Cmd
	port int // a server's TLS port

	mu     sync.Mutex // guards events
	events []string
	done   chan struct{} // closed at stderr's end
	werr   error         // the exit status, once done
	waited bool
}

// startPeer runs st's peer in role ("client" or "server"), relaying to the
// plaintext address plain; a client connects to connect. extra are more
// options (see testdata/peer.h).
func startPeer(t *testing.T, st stack, c *certs, role, connect, plain string, extra ...string) *peer {
	t.Helper()
	bin := peerBin(t, st)
	args := []string{"-role", role, "-plain", plain,
		"-cert", filepath.Join(c.dir, "chain.pem"), "-key", filepath.Join(c.dir, "key.pem"),
		"-ca", filepath.Join(c.dir, "roots.pem")}
	if connect != "" {
		args = append(args, "-connect", connect)
	}
	args = append(args, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	p := &peer{name: st.name, cmd: exec.CommandContext(ctx, bin, args...), done: make(chan struct{})}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s peer: %v", st.name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			if ev, ok := strings.CutPrefix(line, "EVENT "); ok {
				p.events = append(p.events, ev)
			} else {
				p.events = append(p.events, "stderr: "+line)
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		p.wait()
	})
	if role == "server" {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		port, perr := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "LISTEN ")))
		if err != nil || perr != nil {
			<-p.done
			t.Fatalf("%s peer did not listen (%q, %v): %v", st.name, line, err, p.snapshot())
		}
		p.port = port
	}
	return p
}

// wait waits for the process to end and returns its events and exit error.
func (p *peer) wait() ([]string, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.waited {
		p.waited = true
		p.werr = p.cmd.Wait()
	}
	return p.events, p.werr
}

func (p *peer) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.events...)
}

// hasEvent reports whether events holds one starting with prefix.
func hasEvent(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// fatalAlert reports whether the peer received an alert other than
// close_notify (OpenSSL reports that one as an alert too).
func fatalAlert(events []string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, "alert_received ") && !strings.HasPrefix(e, "alert_received 0 ") {
			return true
		}
	}
	return false
}

// field returns the value of key=value in the first event named name.
func field(events []string, name, key string) string {
	for _, e := range events {
		if !strings.HasPrefix(e, name+" ") {
			continue
		}
		for _, f := range strings.Fields(e) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
	}
	return ""
}

// checkClean fails the test unless the peer ended cleanly: it received our
// close_notify, never reported a truncation or an alert, and exited 0.
func checkClean(t *testing.T, st stack, p *peer) []string {
	t.Helper()
	evs, err := p.wait()
	if err != nil {
		t.Errorf("%s peer exited with %v", st.name, err)
	}
	if !hasEvent(evs, "close_notify") || hasEvent(evs, st.truncation) || fatalAlert(evs) ||
		hasEvent(evs, "error") || hasEvent(evs, "fatal") {
		t.Errorf("%s peer did not see a clean close_notify: %q", st.name, evs)
	}
	return evs
}

// acceptOne accepts the peer's plaintext connection.
func acceptOne(t *testing.T, ln *net.TCPListener, p *peer) *net.TCPConn {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(peerTimeout))
	c, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("accept the %s peer's plaintext connection: %v; peer: %q", p.name, err, p.snapshot())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// errIsAny reports whether err matches one of targets.
func errIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
