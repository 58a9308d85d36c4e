package e2e

// Issue 32's descriptor exhaustion, listener by listener, made as an
// attacker makes it (hostile_kit_test.go): one source holds as many idle
// connections (or streams) as the daemon lets it, and meanwhile an honest
// client from another address must still get a new HBONE connection
// through.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// fdPlan sizes a run of TestHostileDescriptors.
type fdPlan struct {
	name string
	// noFile is every daemon's RLIMIT_NOFILE: low, so that one attacker
	// reaches it in seconds.
	noFile uint64
	// attempts bounds the connections (or streams) one attack opens: more
	// than noFile, so an unbounded listener is exhausted before the
	// attacker stops by itself.
	attempts int
	// dnsStalls is how many stalled TCP connections the DNS attack holds.
	dnsStalls int
	// limit bounds one attack's time.
	limit time.Duration
}

var (
	fastFDs = fdPlan{name: "fast", noFile: 1024, attempts: 1100, dnsStalls: 100, limit: time.Minute}
	soakFDs = fdPlan{name: "soak", noFile: 6144, attempts: 6500, dnsStalls: 1000, limit: 5 * time.Minute}
)

const (
	// answerWithin bounds the wait for one attacker connection's answer:
	// a connection unanswered by then sits in a listen backlog the
	// daemon no longer accepts from (it is out of descriptors).
	answerWithin = 5 * time.Second
	// refusedInARow ends an attack: the daemon refuses this source.
	refusedInARow = 16
	// dnsTCPIdle is the DNS proxy's TCP idle timeout today
	// (dnsproxy.DefaultTCPIdleTimeout, ztunnel's TCP request timeout): a
	// stalled connection holds its slot that long.
	dnsTCPIdle = 5 * time.Second
)

// Why an attack stopped.
const (
	stopRefused    = "refused (reset or closed)"
	stopUnanswered = "a connection went unanswered (the daemon stopped accepting)"
	stopAttempts   = "every attempt held"
	stopTime       = "time limit"
)

// held is what one attack holds, and why it stopped.
type held struct {
	conns    []io.Closer
	refused  int
	stop     string
	lastErr  error
	extra    []io.Closer // closed after conns (the HBONE connections under the streams)
	duration time.Duration
}

func (hd *held) release() {
	for _, c := range hd.conns {
		c.Close()
	}
	for _, c := range hd.extra {
		c.Close()
	}
	hd.conns, hd.extra = nil, nil
}

// unanswered reports whether err means no answer came in time, as opposed
// to a refusal (a reset, a close, an error status).
func unanswered(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// hold runs open until the attack stops: open returns one held connection
// or why it got none. Each call has answerWithin.
func hold(plan fdPlan, open func(ctx context.Context) (io.Closer, error)) *held {
	hd := &held{}
	start := time.Now()
	defer func() { hd.duration = time.Since(start) }()
	inARow := 0
	for len(hd.conns)+hd.refused < plan.attempts {
		if time.Since(start) > plan.limit {
			hd.stop = stopTime
			return hd
		}
		ctx, cancel := context.WithTimeout(context.Background(), answerWithin)
		c, err := open(ctx)
		cancel()
		if err == nil {
			hd.conns = append(hd.conns, c)
			inARow = 0
			continue
		}
		hd.lastErr = err
		if unanswered(err) {
			hd.stop = stopUnanswered
			return hd
		}
		hd.refused++
		if inARow++; inARow >= refusedInARow {
			hd.stop = stopRefused
			return hd
		}
	}
	hd.stop = stopAttempts
	return hd
}

// TestHostileDescriptors exhausts the daemon serving target, one listener
// at a time, from the attacker pod (one source address) against daemons run
// with a low RLIMIT_NOFILE, in dedicated and in shared mode:
//
//   - idle keep-alive HTTP connections to readiness (15021) and metrics
//     (15020): on the ztunnel pod's address in shared mode; in dedicated
//     mode the pod's own, which the capture rules take through 15006;
//   - idle plaintext connections to target's app port through 15006
//     (policy allows them);
//   - idle CONNECT streams on 15008 from one authenticated peer over a few
//     HBONE connections (a certificate of the mesh's CA);
//   - stalled TCP connections to target's DNS proxy (15053) from an app in
//     the pod.
//
// While the attacker holds what it got, an honest client from another
// address (the prober pod) opens a new HBONE connection to target and
// makes a request; for DNS an app also sends an honest TCP query. The
// honest client must succeed, and the attacker must be refused past its
// share rather than run the daemon out of descriptors. The figures (held,
// refused, descriptors, outcome) are logged. ZTUNNEL_SOAK=1 (make soak)
// runs larger limits and counts.
func TestHostileDescriptors(t *testing.T) {
	plan := fastFDs
	if os.Getenv(soakEnv) != "" {
		plan = soakFDs
	}
	// The attacker's end and the echo app's end of each connection are
	// in this process.
	raiseNoFile(t, uint64(2*plan.attempts+plan.dnsStalls+1024))
	for _, mode := range hostileModes {
		t.Run(mode, func(t *testing.T) {
			h := startHostile(t, mode, hostileOptions{noFile: plan.noFile, dnsCapture: true})
			d := h.daemons["target"]
			// The daemon's own ports: in shared mode on its ztunnel
			// pod, in dedicated mode on target (through 15006).
			daemonIP := h.pods["target"].IP
			if mode == "shared" {
				daemonIP = d.Pod.IP
			}
			attacks := []struct {
				name string
				open func(ctx context.Context) (io.Closer, error)
				// streams: the attack holds HBONE connections too.
				streams bool
			}{
				{name: "15021 readiness keep-alive", open: func(ctx context.Context) (io.Closer, error) {
					return h.keepAlive(ctx, netip.AddrPortFrom(daemonIP, 15021), "/healthz/ready")
				}},
				{name: "15020 metrics keep-alive", open: func(ctx context.Context) (io.Closer, error) {
					return h.keepAlive(ctx, netip.AddrPortFrom(daemonIP, 15020), "/metrics")
				}},
				{name: "15006 idle plaintext to an app port", open: func(ctx context.Context) (io.Closer, error) {
					return h.plaintext(ctx, h.echo.Addr)
				}},
				{name: "15008 idle CONNECT streams of one peer", streams: true},
			}
			for _, a := range attacks {
				t.Run(a.name, func(t *testing.T) {
					base := settle(func() int64 { n, _ := fdCount(d); return int64(n) })
					var hd *held
					if a.streams {
						hd = h.holdStreams(t, plan)
					} else {
						hd = hold(plan, a.open)
					}
					defer hd.release()
					fds, _ := fdCount(d)
					herr := h.honestHBONE(t)
					t.Logf("%s, %s: the attacker (%s) held %d in %v, %d refused, stopped: %s (last error: %v); "+
						"the daemon's descriptors %d -> %d (limit %d); an honest new HBONE connection from %s: %v",
						a.name, plan.name, h.pods["attacker"].IP, len(hd.conns), hd.duration.Round(time.Millisecond), hd.refused, hd.stop, hd.lastErr,
						base, fds, plan.noFile, h.pods["prober"].IP, outcome(herr))
					if herr != nil {
						t.Errorf("the honest client failed while the attacker held %d: %v", len(hd.conns), herr)
					}
					if hd.stop != stopRefused {
						t.Errorf("the attacker was not refused past its share (stopped: %s, after %d held)", hd.stop, len(hd.conns))
					}
					hd.release()
					h.recovered(t, d, base)
				})
			}
			t.Run("15053 stalled DNS TCP connections", func(t *testing.T) { h.dnsStalls(t, plan) })
		})
	}
}

func outcome(err error) string {
	if err == nil {
		return "succeeded"
	}
	return "failed: " + err.Error()
}

// keepAlive opens a connection from the attacker to dst, makes one HTTP
// GET with keep-alive and leaves the connection idle.
func (h *hostileLab) keepAlive(ctx context.Context, dst netip.AddrPort, path string) (io.Closer, error) {
	c, err := h.pods["attacker"].Dial(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	resp, err := func() (*http.Response, error) {
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, dst); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, err
	}()
	if err == nil && (resp.Close || resp.StatusCode != http.StatusOK) {
		err = fmt.Errorf("answered %s, connection close %v", resp.Status, resp.Close)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// plaintext opens a connection from the attacker to dst (captured into
// 15006), checks one echo and leaves it idle.
func (h *hostileLab) plaintext(ctx context.Context, dst netip.AddrPort) (io.Closer, error) {
	c, err := h.pods["attacker"].Dial(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	if err := nettestRoundTrip(c); err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// nettestRoundTrip sends one byte and reads its echo.
func nettestRoundTrip(c net.Conn) error {
	if _, err := c.Write([]byte{'x'}); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if b[0] != 'x' {
		return fmt.Errorf("echo %q", b[:])
	}
	return nil
}

// dialHBONE opens a new HBONE connection from pod from to dst's 15008,
// authenticated as id with a certificate of the lab's CA.
func (h *hostileLab) dialHBONE(ctx context.Context, from string, cfg *tls.Config, dst netip.Addr, maxStreams uint32) (*hbone.ClientConn, error) {
	raw, err := h.pods[from].Dial(ctx, "tcp", netip.AddrPortFrom(dst, 15008).String())
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	cc, err := hbone.NewClientConn(tc, hbone.Config{MaxStreams: maxStreams})
	if err != nil {
		raw.Close()
		return nil, err
	}
	return cc, nil
}

// clientTLS is the TLS configuration of a client of the mesh called sa
// facing target.
func (h *hostileLab) clientTLS(t *testing.T, sa string) *tls.Config {
	t.Helper()
	cert := tlstest.Cert(t, h.ca, identity.New("", "default", sa))
	return mtls.ClientConfig(cert, []string{"spiffe://cluster.local/ns/default/sa/target"})
}

// streamEcho opens a CONNECT stream on cc to target's echo and checks one
// byte through it.
func (h *hostileLab) streamEcho(ctx context.Context, cc *hbone.ClientConn) (*hbone.Stream, error) {
	s, err := cc.Connect(ctx, &hbone.Request{Authority: h.echo.Addr.String()})
	if err != nil {
		return nil, err
	}
	// A stream has no deadline of its own: ending ctx resets it.
	stop := context.AfterFunc(ctx, func() { s.Close() })
	err = nettestRoundTrip(s)
	if !stop() || err != nil {
		s.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return s, nil
}

// honestHBONE is the honest client: from the prober pod (not the
// attacker's address) a new HBONE connection to target, one CONNECT to its
// echo and a round trip, within 10 s.
func (h *hostileLab) honestHBONE(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := h.dialHBONE(ctx, "prober", h.clientTLS(t, "prober"), h.pods["target"].IP, 0)
	if err != nil {
		return err
	}
	defer cc.Close()
	s, err := h.streamEcho(ctx, cc)
	if err != nil {
		return err
	}
	return s.Close()
}

// holdStreams is the 15008 attack: idle CONNECT streams from one
// authenticated peer, on as few HBONE connections as the server's stream
// limit allows (a new one when a connection is full).
func (h *hostileLab) holdStreams(t *testing.T, plan fdPlan) *held {
	t.Helper()
	cfg := h.clientTLS(t, "attacker")
	var cc *hbone.ClientConn
	var conns []io.Closer
	hd := hold(plan, func(ctx context.Context) (io.Closer, error) {
		for range 2 {
			if cc == nil {
				var err error
				if cc, err = h.dialHBONE(ctx, "attacker", cfg, h.pods["target"].IP, hbone.DefaultServerMaxStreams); err != nil {
					return nil, err
				}
				conns = append(conns, cc)
			}
			s, err := h.streamEcho(ctx, cc)
			if errors.Is(err, hbone.ErrStreamLimit) || errors.Is(err, hbone.ErrGoingAway) || errors.Is(err, hbone.ErrConnClosed) {
				// This connection is full (or gone): the next one.
				cc = nil
				continue
			}
			return s, err
		}
		return nil, errors.New("two new connections in a row took no stream")
	})
	hd.extra = conns
	t.Logf("the 15008 attacker used %d HBONE connections", len(conns))
	return hd
}

// recovered waits for the daemon's descriptors to come back near base once
// the attacker let go, and for the honest client to get through again: the
// next attack starts from a daemon that is whole.
func (h *hostileLab) recovered(t *testing.T, d *labrun.Daemon, base int64) {
	t.Helper()
	var herr error
	if !eventually(30*time.Second, 200*time.Millisecond, func() bool {
		n, _ := fdCount(d)
		if int64(n) > base+32 {
			return false
		}
		herr = h.honestHBONE(t)
		return herr == nil
	}) {
		n, _ := fdCount(d)
		t.Fatalf("the daemon did not recover after the attacker let go: %d descriptors (from %d), honest client: %v", n, base, herr)
	}
}

// dnsStalls holds stalled TCP connections to target's DNS proxy from an app
// in the pod (on 127.0.0.1:15053; every other one sends half a length
// prefix), then sends an honest TCP query for a mesh name from the pod's
// own address (to a resolver address, port 53, which the capture rules
// take to the proxy). The honest query must be answered while the stalled
// connections still hold whatever they took: before the first of them
// could have timed out.
func (h *hostileLab) dnsStalls(t *testing.T, plan fdPlan) {
	target, d := h.pods["target"], h.daemons["target"]
	ctx, cancel := context.WithTimeout(context.Background(), plan.limit)
	defer cancel()
	start := time.Now()
	var stalls []net.Conn
	defer func() {
		for _, c := range stalls {
			c.Close()
		}
	}()
	var derr error
	for i := range plan.dnsStalls {
		c, err := target.Dial(ctx, "tcp", "127.0.0.1:15053")
		if err != nil {
			derr = err
			break
		}
		if i%2 == 1 {
			c.Write([]byte{0}) // the first byte of a length prefix, and no more
		}
		stalls = append(stalls, c)
	}
	opened := time.Since(start)
	// The idle timeout of the first stalled connection started no sooner
	// than start.
	bound := start.Add(dnsTCPIdle)
	q := new(dns.Msg)
	q.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
	var answer *dns.Msg
	qerr := func() error {
		qctx, qcancel := context.WithDeadline(ctx, bound)
		defer qcancel()
		c, err := target.Dial(qctx, "tcp", "10.96.0.53:53")
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(bound)
		dc := &dns.Conn{Conn: c}
		if err := dc.WriteMsg(q); err != nil {
			return err
		}
		answer, err = dc.ReadMsg()
		return err
	}()
	answeredAfter := time.Since(start)
	fds, _ := fdCount(d)
	herr := h.honestHBONE(t)
	t.Logf("15053, %s: %d stalled TCP connections opened in %v (dial error: %v); the honest TCP query answered %v after the first stall: %v, %v; "+
		"the daemon's descriptors %d; an honest new HBONE connection: %v",
		plan.name, len(stalls), opened.Round(time.Millisecond), derr, answeredAfter.Round(time.Millisecond), summarize(answer), qerr, fds, outcome(herr))
	switch {
	case errors.Is(qerr, os.ErrDeadlineExceeded) || errors.Is(qerr, context.DeadlineExceeded):
		t.Errorf("the honest TCP query was not answered before the stalled connections' idle timeout (%v after the first): the stalled ones hold the proxy", dnsTCPIdle)
	case qerr != nil:
		t.Errorf("the honest TCP query failed: %v", qerr)
	case !hasA(answer, "10.96.0.10"):
		t.Errorf("the honest TCP query got %s, want web's VIP 10.96.0.10", summarize(answer))
	}
	if herr != nil {
		t.Errorf("the honest HBONE client failed: %v", herr)
	}
}

func hasA(m *dns.Msg, ip string) bool {
	if m == nil {
		return false
	}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok && a.A.String() == ip {
			return true
		}
	}
	return false
}

func summarize(m *dns.Msg) string {
	if m == nil {
		return "no answer"
	}
	var rrs []string
	for _, rr := range m.Answer {
		rrs = append(rrs, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	return fmt.Sprintf("%s %v", dns.RcodeToString[m.Rcode], rrs)
}
