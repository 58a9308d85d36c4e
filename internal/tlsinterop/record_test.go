package tlsinterop

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// rawConnect makes a TLS connection between our record layer, in role
// ("server": the daemon's 15008 side; "client": its outbound side), and
// the peer, which relays the application data to the returned plaintext
// connection.
func rawConnect(t *testing.T, st stack, c *certs, role string, extra ...string) (*record.Conn, *net.TCPConn, *peer) {
	t.Helper()
	plain := nettest.Listen(t)
	var conn *record.Conn
	var p *peer
	if role == "server" {
		ln := nettest.Listen(t)
		p = startPeer(t, st, c, "client", ln.Addr().String(), plain.Addr().String(), extra...)
		_ = ln.SetDeadline(time.Now().Add(peerTimeout))
		tc, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		conn = record.Server(tc, mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return c.ours, nil }))
	} else {
		p = startPeer(t, st, c, "server", "", plain.Addr().String(), extra...)
		tc, err := dialTCP(net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
		if err != nil {
			t.Fatal(err)
		}
		conn = record.Client(tc, mtls.ClientConfig(c.ours, []string{c.theirSAN}))
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		evs, _ := p.wait()
		t.Fatalf("handshake: %v; peer: %q", err, evs)
	}
	if err := checkOurRecords(conn); err != nil {
		t.Fatal(err)
	}
	return conn, acceptOne(t, plain, p), p
}

// oneWay writes n pseudo-random bytes to w, calling mid once half of them
// are written, then half-closes w; it returns their SHA-256.
func oneWay(w nettest.HalfCloser, n int, seed uint64, mid func() error) ([]byte, error) {
	h := sha256.New()
	r := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 32<<10)
	midDone := mid == nil
	for left := n; left > 0; {
		k := min(left, len(buf))
		for i := range buf[:k] {
			buf[i] = byte(r.Uint32())
		}
		h.Write(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		left -= k
		if !midDone && left <= n/2 {
			midDone = true
			if err := mid(); err != nil {
				return nil, err
			}
		}
	}
	return h.Sum(nil), w.CloseWrite()
}

// readSum reads r to its end and returns the SHA-256 and count of what came.
func readSum(r io.Reader) ([]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return h.Sum(nil), n, err
}

// TestRecordBothWays: with our record.Conn under test directly, data flows
// both ways at once, checksummed, while our side moves its keys on in the
// middle (asking the peer to move its own, or not). Our CloseWrite sends
// close_notify, the peer's arrives as io.EOF, and the peer reports ours.
func TestRecordBothWays(t *testing.T) {
	const n = 8 << 20
	for _, st := range stacks {
		for _, role := range roles {
			for _, request := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/our-%s/our-keyupdate-request=%v", st.name, role, request), func(t *testing.T) {
					c := newCerts(t)
					conn, plain, p := rawConnect(t, st, c, role)
					type result struct {
						sum []byte
						n   int64
						err error
					}
					toPeer, fromPeer := make(chan result, 1), make(chan result, 1)
					sentOurs, sentTheirs := make(chan result, 1), make(chan result, 1)
					go func() {
						sum, err := oneWay(conn, n, 1, func() error { return conn.KeyUpdate(request) })
						sentOurs <- result{sum, n, err}
					}()
					go func() {
						sum, err := oneWay(plain, n, 2, nil)
						sentTheirs <- result{sum, n, err}
					}()
					go func() {
						sum, m, err := readSum(plain)
						toPeer <- result{sum, m, err}
					}()
					go func() {
						sum, m, err := readSum(conn)
						fromPeer <- result{sum, m, err}
					}()
					for _, dir := range []struct {
						name       string
						sent, came chan result
					}{{"to the peer", sentOurs, toPeer}, {"from the peer", sentTheirs, fromPeer}} {
						s, r := <-dir.sent, <-dir.came
						if s.err != nil || r.err != nil || r.n != n || !bytes.Equal(s.sum, r.sum) {
							t.Errorf("%s: sent %v, received %d bytes (%v), checksums equal: %v", dir.name, s.err, r.n, r.err, bytes.Equal(s.sum, r.sum))
						}
					}
					if err := conn.Close(); err != nil {
						t.Errorf("close: %v", err)
					}
					plain.Close()
					evs := checkClean(t, st, p)
					if got, _ := strconv.Atoi(field(evs, "done", "keyupdates_received")); got < 1 {
						t.Errorf("%s peer received %d KeyUpdates from us, want at least 1: %q", st.name, got, evs)
					}
				})
			}
		}
	}
}

// TestRecordCloseOrders: our Close after the peer's close_notify, and our
// Close first: either way the peer reads our close_notify.
func TestRecordCloseOrders(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			for _, first := range []string{"ours", "theirs"} {
				t.Run(st.name+"/our-"+role+"/"+first+"-first", func(t *testing.T) {
					c := newCerts(t)
					conn, plain, p := rawConnect(t, st, c, role)
					if _, err := conn.Write([]byte("hello")); err != nil {
						t.Fatal(err)
					}
					if first == "theirs" {
						// The peer's plaintext side ends: it sends
						// close_notify, which we read as io.EOF.
						if err := plain.CloseWrite(); err != nil {
							t.Fatal(err)
						}
						if got, err := io.ReadAll(conn); err != nil || len(got) != 0 {
							t.Fatalf("read %q, %v; want the peer's close_notify (io.EOF)", got, err)
						}
					}
					if err := conn.Close(); err != nil {
						t.Errorf("close: %v", err)
					}
					got, err := io.ReadAll(plain)
					if err != nil || string(got) != "hello" {
						t.Errorf("peer relayed %q, %v; want \"hello\" then the end", got, err)
					}
					plain.Close()
					checkClean(t, st, p)
				})
			}
		}
	}
}
