package labrun

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// DemoOptions configure Demo.
type DemoOptions struct {
	// Binary is the ztunnel executable.
	Binary string
	// ConfigPath is the mesh config (examples/demo.yaml).
	ConfigPath string
	// Prefix names the lab's namespaces (default "zl-demo").
	Prefix string
	// TransferBytes is the size of the bulk transfer (default 256 MiB).
	TransferBytes int
	// Keep leaves the lab up after the demo (for poking around with zlab exec).
	Keep bool
}

// Demo builds the lab the config describes, sends real traffic pod to pod
// across nodes through HBONE, shows a policy decision both ways, prints a
// summary to out, and tears everything down. It fails if any step does not
// behave as the mesh promises.
func Demo(ctx context.Context, o DemoOptions, out io.Writer) (err error) {
	if o.Prefix == "" {
		o.Prefix = "zl-demo"
	}
	if o.TransferBytes == 0 {
		o.TransferBytes = 256 << 20
	}
	if m := netnslab.Missing(); m != "" {
		return fmt.Errorf("the demo builds network namespaces: %s", m)
	}
	config, err := os.ReadFile(o.ConfigPath)
	if err != nil {
		return err
	}
	if _, err := netnslab.CleanupStale(o.Prefix); err != nil {
		return err
	}
	lab, err := netnslab.NewLab(o.Prefix)
	if err != nil {
		return err
	}
	defer func() {
		if o.Keep {
			fmt.Fprintf(out, "\nlab left up (prefix %s); remove it with: zlab down --prefix %s\n", o.Prefix, o.Prefix)
			err = errors.Join(err, lab.Detach())
			return
		}
		err = errors.Join(err, lab.Close())
	}()
	dir, err := os.MkdirTemp("", "ztunnel-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	step("building the lab from %s and starting one ztunnel per node (shared mode: a fake CNI agent hands it each pod's netns)", o.ConfigPath)
	// Two pods outside the mesh give the direct baseline for the transfer.
	c, err := StartSharedCluster(ctx, lab, config, SharedOptions{
		Binary: o.Binary, Dir: dir,
		ExtraPods: map[string][]string{"node-a": {"direct-a"}, "node-b": {"direct-b"}},
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    POD\tNODE\tIP\tIDENTITY\tZTUNNEL")
	for _, w := range c.Snapshot.Workloads() {
		p := c.Pods[w.Name]
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", w.Name, w.Node(), p.IP, w.Identity(), c.Daemons[w.Node()].Pod.Name)
	}
	tw.Flush()

	server, err := StartEcho(c.Pods["server"], 8080)
	if err != nil {
		return err
	}
	defer server.Close()
	db, err := StartEcho(c.Pods["db"], 9999)
	if err != nil {
		return err
	}
	defer db.Close()

	type result struct{ what, outcome string }
	var results []result
	fail := func(what string, e error) error { return fmt.Errorf("%s: %w", what, e) }

	// 1. A bulk transfer client -> server across nodes.
	step("client (node-a) -> server:8080 (node-b): %d MiB echoed through HBONE", o.TransferBytes>>20)
	payload := make([]byte, o.TransferBytes)
	rand.Read(payload)
	start := time.Now()
	got, err := demoRoundTrip(ctx, c.Pods["client"], netip.AddrPortFrom(c.Pods["server"].IP, 8080), payload)
	elapsed := time.Since(start)
	if err != nil {
		return fail("bulk transfer", err)
	}
	if sha256.Sum256(got) != sha256.Sum256(payload) {
		return fail("bulk transfer", fmt.Errorf("echo differs: sent %d bytes, got %d", len(payload), len(got)))
	}
	gbps := float64(2*len(payload)*8) / elapsed.Seconds() / 1e9
	direct, err := StartEcho(c.Pods["direct-b"], 8080)
	if err != nil {
		return err
	}
	defer direct.Close()
	start = time.Now()
	got, err = demoRoundTrip(ctx, c.Pods["direct-a"], direct.Addr, payload)
	directElapsed := time.Since(start)
	if err != nil || len(got) != len(payload) {
		return fail("direct baseline", fmt.Errorf("echoed %d of %d bytes: %v", len(got), len(payload), err))
	}
	directGbps := float64(2*len(payload)*8) / directElapsed.Seconds() / 1e9
	line, err := c.Daemons[c.Pods["server"].Node.Name].WaitLog(ctx, "connection complete", `direction="inbound"`, "src.identity=")
	if err != nil {
		return fail("bulk transfer", err)
	}
	fmt.Fprintf(out, "    %d MiB each way in %v (%.2f Gbit/s both directions together), checksums match\n", len(payload)>>20, elapsed.Round(time.Millisecond), gbps)
	fmt.Fprintf(out, "    the same between two pods outside the mesh (direct-a -> direct-b): %v (%.2f Gbit/s); HBONE = %.2fx direct\n",
		directElapsed.Round(time.Millisecond), directGbps, gbps/directGbps)
	fmt.Fprintf(out, "    server's ztunnel: %s\n", trimLog(line))
	results = append(results, result{"client -> server:8080 (HBONE, mTLS)", fmt.Sprintf("allowed, %d MiB echoed, %.2f Gbit/s (%.2fx direct)", len(payload)>>20, gbps, gbps/directGbps)})
	if peers := server.Peers(); len(peers) > 0 {
		fmt.Fprintf(out, "    the server app saw the connection come from %s (the client pod: source preserved)\n", peers[len(peers)-1].Addr())
	}

	// 2. The same through the service VIP.
	step("client -> server.demo.svc VIP 10.96.0.10:80: load-balanced to the server's 8080 through HBONE")
	got, err = demoRoundTrip(ctx, c.Pods["client"], netip.MustParseAddrPort("10.96.0.10:80"), []byte("hello via the service"))
	if err != nil || string(got) != "hello via the service" {
		return fail("service VIP", fmt.Errorf("got %q, %v", got, err))
	}
	results = append(results, result{"client -> server VIP 10.96.0.10:80", "allowed, routed to 10.244.1.2:8080"})

	// 3. The policy refuses the intruder's identity.
	step("intruder (node-a) -> server:8080: the ALLOW policy demo/server-allow-client admits only the client")
	got, rtErr := demoRoundTrip(ctx, c.Pods["intruder"], netip.AddrPortFrom(c.Pods["server"].IP, 8080), []byte("let me in"))
	if rtErr == nil || len(got) != 0 {
		return fail("policy", fmt.Errorf("the intruder got %q (err %v); want the connection refused", got, rtErr))
	}
	line, err = c.Daemons[c.Pods["server"].Node.Name].WaitLog(ctx, "connection complete", "policy rejection")
	if err != nil {
		return fail("policy", err)
	}
	fmt.Fprintf(out, "    refused: the intruder's connection was reset (%v)\n", errShort(rtErr))
	fmt.Fprintf(out, "    server's ztunnel: %s\n", trimLog(line))
	results = append(results, result{"intruder -> server:8080", "denied (401 on the tunnel, reset to the app)"})

	// 4. The DENY on port 9999 applies to everyone.
	step("client -> db:9999: the DENY policy demo/deny-9999 refuses the port for everyone")
	got, err = demoRoundTrip(ctx, c.Pods["client"], netip.AddrPortFrom(c.Pods["db"].IP, 9999), []byte("port 9999?"))
	if err == nil || len(got) != 0 {
		return fail("deny policy", fmt.Errorf("got %q (err %v); want the connection refused", got, err))
	}
	if len(db.Peers()) != 0 {
		return fail("deny policy", errors.New("the db app received a connection on a denied port"))
	}
	results = append(results, result{"client -> db:9999", "denied by demo/deny-9999"})

	step("summary")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    TRAFFIC\tOUTCOME")
	for _, r := range results {
		fmt.Fprintf(tw, "    %s\t%s\n", r.what, r.outcome)
	}
	tw.Flush()
	return nil
}

func demoRoundTrip(ctx context.Context, pod *netnslab.Pod, dst netip.AddrPort, payload []byte) ([]byte, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pod.Dial(dctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	c := conn.(*net.TCPConn)
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	return nettest.Exchange(c, payload)
}

func trimLog(line string) string {
	// Drop the timestamp the plain format puts first.
	if _, rest, ok := strings.Cut(line, "\t"); ok {
		line = strings.ReplaceAll(rest, "\t", " ")
	}
	if len(line) > 240 {
		line = line[:240] + "..."
	}
	return line
}

func errShort(err error) string {
	if err == nil {
		return "no error"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}
