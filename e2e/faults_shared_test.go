package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// faultConfig is the shared-mode mesh of the data-path fault tests: client
// and victim on node-a, server on node-b, all HBONE.
const faultConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-victim, name: victim, namespace: default, serviceAccount: victim, workloadIps: ["10.244.0.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {}}
`

// sourceServer is a test application that sends a requested amount of
// deterministic bytes: the client sends a mode byte ('S' to end with FIN,
// 'R' to end with a reset) and the size as 8 big-endian bytes. It counts
// what it has written, which is what the path holds while the client does
// not read.
type sourceServer struct {
	addr    netip.AddrPort
	written atomic.Int64
}

func startSource(t *testing.T, pod *netnslab.Pod, port uint16) *sourceServer {
	t.Helper()
	s := &sourceServer{}
	s.addr = servePod(t, pod, port, func(c net.Conn) { s.serve(c.(*net.TCPConn)) }).Addr
	return s
}

func (s *sourceServer) serve(c *net.TCPConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	n := int64(binary.BigEndian.Uint64(hdr[1:]))
	src := newStream()
	buf := make([]byte, 64<<10)
	for n > 0 {
		chunk := buf[:min(int64(len(buf)), n)]
		src.Read(chunk)
		w, err := c.Write(chunk)
		s.written.Add(int64(w))
		if err != nil {
			return
		}
		n -= int64(w)
	}
	if hdr[0] == 'R' {
		c.SetLinger(0)
		return
	}
	c.CloseWrite()
	io.Copy(io.Discard, c)
}

// newStream returns the deterministic byte stream the source sends.
func newStream() *rand.ChaCha8 { return rand.NewChaCha8([32]byte{'z', 't', 'u', 'n'}) }

// streamSum is the SHA-256 of the first n bytes of the stream.
func streamSum(n int64) [32]byte {
	h := sha256.New()
	io.CopyN(h, newStream(), n)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// request asks the source for n bytes ending with mode.
func request(c net.Conn, mode byte, n int64) error {
	var hdr [9]byte
	hdr[0] = mode
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	_, err := c.Write(hdr[:])
	return err
}

func startFaultShared(t *testing.T) *labrun.SharedCluster {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, faultConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
	})
	return c
}

// settle polls f until it returns the same value three times in a row (or
// a generous limit passes) and returns that value.
func settle(f func() int64) int64 {
	last, same := f(), 0
	for deadline := time.Now().Add(30 * time.Second); same < 3 && time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		v := f()
		if v == last {
			same++
		} else {
			last, same = v, 0
		}
	}
	return last
}

// TestDataFaults runs data-path faults against shared-mode daemons on two
// nodes: a slow reader, a reset in the middle of a transfer, descriptor
// exhaustion, a pod's namespace vanishing under an open connection, and a
// daemon killed with SIGKILL.
func TestDataFaults(t *testing.T) {
	c := startFaultShared(t)
	client, server := c.Pods["client"], c.Pods["server"]
	echo := startEcho(t, server, 8080)
	src := startSource(t, server, 9000)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	long, err := dialEcho(ctx, client, echo.Addr, "before the faults")
	if err != nil {
		t.Fatalf("client -> server: %v", err)
	}
	defer long.Close()

	t.Run("slow reader: bounded buffering, no byte lost", func(t *testing.T) {
		// Far more than the path may hold: with unbounded buffering the
		// source would write all of it before the client reads a byte.
		const total = 256 << 20
		const bound = 96 << 20 // socket buffers on 4 hops plus the HBONE windows, with room
		before := map[string]labrun.Stats{}
		for node, d := range c.Daemons {
			st, err := d.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before[node] = st
		}
		conn, err := client.Dial(ctx, "tcp", src.addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := src.written.Load()
		if err := request(conn, 'S', total); err != nil {
			t.Fatal(err)
		}
		inFlight := settle(func() int64 { return src.written.Load() - start })
		t.Logf("with the reader stalled the path holds %.1f MiB", float64(inFlight)/(1<<20))
		for node, d := range c.Daemons {
			st, err := d.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			growth := int64(st.RSS) - int64(before[node].RSS)
			t.Logf("daemon %s while stalled: %v (RSS %+.1f MiB)", node, st, float64(growth)/(1<<20))
			if growth > bound {
				t.Errorf("daemon %s grew by %d MiB holding a stalled stream", node, growth>>20)
			}
		}
		if inFlight >= bound {
			t.Fatalf("the stalled path took %d MiB; want it bounded below %d MiB", inFlight>>20, bound>>20)
		}
		// Now read, slowly at first, and check every byte.
		conn.SetDeadline(time.Now().Add(3 * time.Minute))
		h := sha256.New()
		for range 32 {
			if _, err := io.CopyN(h, conn, 64<<10); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		n, err := io.Copy(h, conn)
		n += 32 << 16
		if err != nil || n != total {
			t.Fatalf("read %d of %d bytes: %v", n, total, err)
		}
		var sum [32]byte
		if h.Sum(sum[:0]); sum != streamSum(total) {
			t.Fatal("the bytes that arrived differ from those sent")
		}
	})

	t.Run("reset in the middle of a transfer reaches the client", func(t *testing.T) {
		conn, err := client.Dial(ctx, "tcp", src.addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(time.Minute))
		if err := request(conn, 'R', 8<<20); err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, conn)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after %d bytes the client read %v, want ECONNRESET", n, err)
		}
		t.Logf("the client read %d bytes, then ECONNRESET", n)
		if err := nettest.RoundTrip(long, "others unaffected"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("descriptor exhaustion: clear error, backoff, recovery", func(t *testing.T) {
		d := c.Daemons["node-a"]
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old, err := d.SetNoFile(uint64(st.FDs + 16))
		if err != nil {
			t.Fatal(err)
		}
		restored := false
		restore := func() {
			if !restored {
				restored = true
				if err := d.RestoreNoFile(old); err != nil {
					t.Error(err)
				}
			}
		}
		defer restore()
		// More connections than descriptors: the kernel queues them in the
		// backlog, the daemon fails to accept the rest.
		var held []net.Conn
		defer func() {
			for _, h := range held {
				h.Close()
			}
		}()
		for range 48 {
			hc, err := client.Dial(ctx, "tcp", echo.Addr.String())
			if err != nil {
				break
			}
			held = append(held, hc)
		}
		line, err := d.WaitLog(ctx, "accept failed", "too many open files")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("with %d connections held: %s", len(held), line)
		// The accept loop backs off instead of spinning on the pending
		// connections: count its complaints and CPU over a while.
		count := func() int { return strings.Count(d.Log(), "accept failed") }
		lines0, cpu0 := count(), must(d.CPUTime())
		time.Sleep(3 * time.Second)
		lines1, cpu1 := count(), must(d.CPUTime())
		t.Logf("over 3s of exhaustion: %d accept errors logged, %v CPU used", lines1-lines0, cpu1-cpu0)
		if lines1-lines0 > 60 {
			t.Errorf("%d accept errors in 3s: the accept loop is spinning", lines1-lines0)
		}
		// Free the descriptors: the daemon serves again.
		for _, h := range held {
			h.Close()
		}
		held = nil
		restore()
		nc := waitDialEcho(t, client, echo.Addr, "after the descriptors came back")
		nc.Close()
		if err := nettest.RoundTrip(long, "the long connection outlived the exhaustion"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("descriptor exhaustion on the server side: refused with a clear error, recovery", func(t *testing.T) {
		d := c.Daemons["node-b"]
		warm := waitDialEcho(t, client, echo.Addr, "pool warm") // the HBONE connection exists before
		defer warm.Close()
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old, err := d.SetNoFile(uint64(st.FDs + 8))
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Conn
		refused := 0
		for range 24 {
			hc, err := dialEcho(ctx, client, echo.Addr, "server side exhausted?")
			if err != nil {
				refused++
				continue
			}
			held = append(held, hc)
		}
		t.Logf("with node-b's descriptors exhausted: %d connections through, %d refused", len(held), refused)
		line, lerr := d.WaitLog(ctx, "too many open files")
		for _, h := range held {
			h.Close()
		}
		if err := d.RestoreNoFile(old); err != nil {
			t.Error(err)
		}
		if refused == 0 {
			t.Fatal("every connection went through with node-b out of descriptors")
		}
		if lerr != nil {
			t.Fatal(lerr)
		}
		t.Logf("node-b: %s", line)
		nc := waitDialEcho(t, client, echo.Addr, "after node-b's descriptors came back")
		nc.Close()
		if err := nettest.RoundTrip(warm, "the pooled connection outlived the exhaustion"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("pod namespace deleted under an open connection", func(t *testing.T) {
		victim := c.Pods["victim"]
		vc, err := dialEcho(ctx, victim, echo.Addr, "from the victim")
		if err != nil {
			t.Fatal(err)
		}
		defer vc.Close()
		// As the runtime tears a pod down: its interface, then its netns,
		// without a word to the CNI agent yet.
		if out, err := victim.Command(ctx, "ip", "link", "del", "eth0").CombinedOutput(); err != nil {
			t.Fatalf("ip link del eth0: %v %s", err, out)
		}
		if err := victim.Delete(); err != nil {
			t.Fatal(err)
		}
		vc.SetDeadline(time.Now().Add(time.Second))
		if _, err := vc.Write([]byte("into the void")); err == nil {
			vc.Read(make([]byte, 1))
		}
		// The daemon keeps serving the other pods.
		if err := nettest.RoundTrip(long, "others unaffected"); err != nil {
			t.Fatalf("open connection of another pod: %v", err)
		}
		nc := waitDialEcho(t, client, echo.Addr, "new connection of another pod")
		nc.Close()
		// The agent catches up with a Del; the daemon lets the pod go.
		if err := c.RemoveFromMesh("victim"); err != nil {
			t.Fatal(err)
		}
		if _, ok := workloadState(ctx, t, c.Daemons["node-a"])[c.UID("victim")]; ok {
			t.Error("the deleted pod is still in workloadState")
		}
		if code, _, err := c.Daemons["node-a"].Get(ctx, "http://127.0.0.1:15021/healthz/ready"); err != nil || code != 200 {
			t.Fatalf("readiness after the pod vanished: %d %v", code, err)
		}
	})

	t.Run("daemon killed with SIGKILL and restarted", func(t *testing.T) {
		old := c.Daemons["node-a"]
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		c.StopDaemon(old) // already gone: only marks it
		// Its connections end with it rather than hanging.
		long.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := long.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a connection through the killed daemon stayed open")
		}
		for _, port := range []uint16{15001, 15006, 15008} {
			if n, err := labrun.Listeners(client.NS, port); err != nil || n != 0 {
				t.Fatalf("port %d in the client pod after the kill: %d listeners, %v", port, n, err)
			}
		}
		if _, err := c.StartDaemon(ctx, "node-a"); err != nil {
			t.Fatal(err)
		}
		for _, port := range []uint16{15001, 15006, 15008} {
			if n, err := labrun.Listeners(client.NS, port); err != nil || n != 1 {
				t.Errorf("port %d in the client pod after the restart: %d listeners (want 1), %v", port, n, err)
			}
		}
		nc := waitDialEcho(t, client, echo.Addr, "through the new daemon")
		nc.Close()
	})

	t.Run("server side daemon killed: the client's pool does not reuse the dead connection", func(t *testing.T) {
		open := waitDialEcho(t, client, echo.Addr, "pooled")
		defer open.Close()
		old := c.Daemons["node-b"]
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		c.StopDaemon(old)
		open.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := open.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a connection through the killed server-side daemon stayed open")
		}
		if _, err := c.StartDaemon(ctx, "node-b"); err != nil {
			t.Fatal(err)
		}
		for _, port := range []uint16{15001, 15006, 15008} {
			if n, err := labrun.Listeners(server.NS, port); err != nil || n != 1 {
				t.Errorf("port %d in the server pod after the restart: %d listeners (want 1), %v", port, n, err)
			}
		}
		// The first attempt must work: the client's daemon saw its pooled
		// HBONE connection die with the old daemon.
		nc, err := dialEcho(ctx, client, echo.Addr, "first try after the restart")
		if err != nil {
			t.Fatalf("first connection after node-b's daemon was replaced: %v", err)
		}
		nc.Close()
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
