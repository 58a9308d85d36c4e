package tlsinterop

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// daemonH2 is the HTTP/2 configuration internal/app gives the 15008 server
// and the outbound pool by default (HTTP2_STREAM_WINDOW_SIZE,
// HTTP2_CONNECTION_WINDOW_SIZE, HTTP2_FRAME_SIZE): one DATA frame spans
// many full-size TLS records.
var daemonH2 = hbone.Config{StreamWindow: 4 << 20, ConnWindow: 16 << 20, MaxFrameSize: 1 << 20}

// echo answers CONNECT with 200 and echoes the stream, following the
// peer's half-close with its own.
func echo(_ context.Context, req *hbone.ServerRequest) {
	s, err := req.Respond(200, nil)
	if err != nil {
		return
	}
	defer s.Close()
	if _, err := io.Copy(s, s); err == nil {
		_ = s.CloseWrite()
	}
}

// serveHBONE is the daemon's inbound 15008 path (proxy.handleHBONE): mTLS
// terminated by mtls/record under mtls.ServerConfig, then the HBONE
// server. It returns why the connection ended (nil: cleanly).
func serveHBONE(tc *net.TCPConn, cfg *tls.Config, srv *hbone.Server) error {
	conn := record.Server(tc, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := conn.HandshakeContext(ctx)
	cancel()
	if err != nil {
		tc.Close()
		return fmt.Errorf("handshake: %w", err)
	}
	if err := checkOurRecords(conn); err != nil {
		conn.Close()
		return err
	}
	err = srv.ServeConn(context.Background(), conn)
	conn.Close()
	return err
}

// checkOurRecords fails a connection whose data crypto/tls would keep
// (mtls/record protects the AES-GCM suites of TLS 1.3 and falls back to
// crypto/tls for any other): the record layer would not be under test.
func checkOurRecords(conn *record.Conn) error {
	cs := conn.ConnectionState()
	if cs.Version != tls.VersionTLS13 || (cs.CipherSuite != tls.TLS_AES_128_GCM_SHA256 && cs.CipherSuite != tls.TLS_AES_256_GCM_SHA384) {
		return fmt.Errorf("negotiated %s, which mtls/record leaves to crypto/tls", tls.CipherSuiteName(cs.CipherSuite))
	}
	return nil
}

// link is one HBONE connection between our side and a foreign TLS peer,
// with the HTTP/2 client on whichever side the role puts it.
type link struct {
	cc *hbone.ClientConn
	p  *peer
	// ourEnd waits for why our TLS connection ended (nil: cleanly).
	ourEnd func() error
	// closeOurs closes our side first, abruptly; drainOurs drains it
	// (GOAWAY, then the close once no stream is left); closeTheirs makes
	// the peer close first (its plaintext side ends, so it sends
	// close_notify).
	closeOurs, drainOurs, closeTheirs func()
}

// connect opens a link for role: "server" (our 15008 server, the peer's
// TLS client) or "client" (our outbound client, the peer's TLS server).
// extra are peer options.
func connect(t *testing.T, st stack, c *certs, role string, extra ...string) *link {
	t.Helper()
	l, _ := connectTapped(t, st, c, role, false, extra...)
	return l
}

// serveOurs is our side as the 15008 server: it accepts one connection
// (within peerTimeout) on a fresh listener at addr and serves HBONE with
// the echo on it; end yields why that connection ended. Cleanup closes the
// listener and the server and waits for the accept.
func serveOurs(t *testing.T, c *certs) (srv *hbone.Server, addr string, end <-chan error) {
	t.Helper()
	srv = hbone.NewServer(daemonH2, echo)
	ln := nettest.Listen(t)
	cfg := mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return c.ours, nil })
	ended := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = ln.SetDeadline(time.Now().Add(peerTimeout))
		tc, err := ln.AcceptTCP()
		if err != nil {
			ended <- err
			return
		}
		ended <- serveHBONE(tc, cfg, srv)
	})
	t.Cleanup(func() {
		ln.Close()
		srv.Close()
		wg.Wait()
	})
	return srv, ln.Addr().String(), ended
}

// connectTapped is connect with, if tapped, a tap on the TLS connection.
func connectTapped(t *testing.T, st stack, c *certs, role string, tapped bool, extra ...string) (*link, *tap) {
	t.Helper()
	var tp *tap
	plain := nettest.Listen(t)
	if role == "server" {
		srv, addr, end := serveOurs(t, c)
		if tapped {
			tp = newTap(t, addr)
			addr = tp.addr()
		}
		p := startPeer(t, st, c, "client", addr, plain.Addr().String(), extra...)
		pc := acceptOne(t, plain, p)
		cc, err := hbone.NewClientConn(pc, daemonH2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		var once sync.Once
		var endErr error
		return &link{
			cc: cc, p: p,
			ourEnd: func() error {
				once.Do(func() { endErr = <-end })
				return endErr
			},
			closeOurs: func() { srv.Close() },
			drainOurs: func() {
				ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
				defer cancel()
				_ = srv.Shutdown(ctx)
			},
			closeTheirs: func() { cc.Close() },
		}, tp
	}
	// Our client: the peer's plaintext side is an HBONE server.
	srv := hbone.NewServer(daemonH2, echo)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			pc, err := plain.AcceptTCP()
			if err != nil {
				return
			}
			wg.Go(func() { _ = srv.ServeConn(context.Background(), pc) })
		}
	})
	t.Cleanup(func() {
		plain.Close()
		srv.Close()
		wg.Wait()
	})
	p := startPeer(t, st, c, "server", "", plain.Addr().String(), extra...)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	if tapped {
		tp = newTap(t, addr)
		addr = tp.addr()
	}
	tc, err := dialTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	// As proxy/outbound.go dials.
	conn := record.Client(tc, mtls.ClientConfig(c.ours, []string{c.theirSAN}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = conn.HandshakeContext(ctx)
	cancel()
	if err != nil {
		tc.Close()
		evs, _ := p.wait()
		t.Fatalf("handshake with the %s server: %v; peer: %q", st.name, err, evs)
	}
	if err := checkOurRecords(conn); err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(conn, daemonH2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &link{
		cc: cc, p: p,
		ourEnd: func() error {
			select {
			case <-cc.Done():
			case <-time.After(peerTimeout):
				return errors.New("connection did not end")
			}
			err := cc.Err()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		},
		closeOurs: func() { cc.Close() },
		drainOurs: func() {
			ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
			defer cancel()
			_ = cc.Shutdown(ctx)
		},
		closeTheirs: func() { srv.Close() },
	}, tp
}

// stream opens a CONNECT stream to the echo.
func (l *link) stream(t *testing.T) *hbone.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	s, err := l.cc.Connect(ctx, &hbone.Request{Authority: "10.0.0.1:8080"})
	if err != nil {
		evs, _ := l.p.wait()
		t.Fatalf("CONNECT: %v; our end: %v; peer: %q", err, l.ourEnd(), evs)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// echoOn runs nettest.CheckEcho of n bytes on a new stream.
func (l *link) echoOn(t *testing.T, n int) {
	t.Helper()
	if err := nettest.CheckEcho(l.stream(t), int64(n), uint64(n), 0); err != nil {
		t.Fatalf("echo of %d bytes: %v; peer: %q", n, err, l.p.snapshot())
	}
}

var roles = []string{"server", "client"}

// TestHBONETransfers: transfers from 0 B to 64 MiB, checksummed both ways,
// one stream after another, then many streams at once; the peer closes
// first and must receive our close_notify.
func TestHBONETransfers(t *testing.T) {
	sizes := []int{0, 1, 16383, 16384, 16385, 1 << 20, 64 << 20}
	for _, st := range stacks {
		for _, role := range roles {
			t.Run(st.name+"/our-"+role, func(t *testing.T) {
				c := newCerts(t)
				l := connect(t, st, c, role)
				for _, n := range sizes {
					l.echoOn(t, n)
				}
				const streams, each = 32, 256 << 10
				errs := make(chan error, streams)
				for i := range streams {
					s := l.stream(t)
					go func() { errs <- nettest.CheckEcho(s, each, uint64(i), 0) }()
				}
				for range streams {
					if err := <-errs; err != nil {
						t.Errorf("one of %d concurrent streams: %v", streams, err)
					}
				}
				l.closeTheirs()
				if err := l.ourEnd(); err != nil {
					t.Errorf("our connection ended with %v, want a clean end", err)
				}
				checkClean(t, st, l.p)
			})
		}
	}
}

// TestHBONECloseOrders: whoever closes first, and however (our abrupt
// close, our drain, the peer's end), the peer receives our close_notify
// and reports no truncation.
func TestHBONECloseOrders(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			for _, first := range []string{"ours-abrupt", "ours-drain", "theirs"} {
				t.Run(st.name+"/our-"+role+"/"+first+"-first", func(t *testing.T) {
					c := newCerts(t)
					l := connect(t, st, c, role)
					l.echoOn(t, 100<<10)
					switch first {
					case "ours-abrupt":
						l.closeOurs()
					case "ours-drain":
						l.drainOurs()
					default:
						l.closeTheirs()
					}
					_ = l.ourEnd()
					evs := checkClean(t, st, l.p)
					if !hasEvent(evs, "close_notify_sent") {
						t.Errorf("%s peer never sent its own close_notify: %q", st.name, evs)
					}
				})
			}
		}
	}
}

// TestHBONEPeerKeyUpdate: the peer moves its keys on in the middle of a
// transfer, with and without asking us to; asked, we answer with our own
// KeyUpdate, which the peer reports receiving.
func TestHBONEPeerKeyUpdate(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			for _, request := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/our-%s/update_requested=%v", st.name, role, request), func(t *testing.T) {
					c := newCerts(t)
					extra := []string{"-keyupdate-at", strconv.Itoa(1 << 20)}
					if request {
						extra = append(extra, "-keyupdate-request")
					}
					l := connect(t, st, c, role, extra...)
					l.echoOn(t, 4<<20)
					l.closeTheirs()
					_ = l.ourEnd()
					evs := checkClean(t, st, l.p)
					if !hasEvent(evs, "keyupdate_sent") {
						t.Fatalf("%s peer sent no KeyUpdate: %q", st.name, evs)
					}
					got, _ := strconv.Atoi(field(evs, "done", "keyupdates_received"))
					if request && got < 1 || !request && got != 0 {
						t.Errorf("%s peer received %d KeyUpdates from us, want %s", st.name, got,
							map[bool]string{true: "at least 1", false: "none"}[request])
					}
				})
			}
		}
	}
}

// TestHBONEPaddedRecords: records padded by the peer, and padded to the
// largest inner plaintext RFC 8446 allows (2^14+1 bytes), are read.
//
// A tap on the wire proves the sizes: the largest record either way is
// 2^14+1+16 bytes of ciphertext (2^14 bytes of content and its type byte,
// or less content and padding, plus the tag), never more; the peer reports
// how many of its records it padded to that maximum.
func TestHBONEPaddedRecords(t *testing.T) {
	const maxRecord = 1<<14 + 1 + 16
	for _, st := range stacks {
		for _, role := range roles {
			for _, pad := range []int{0, 512, 16384} {
				t.Run(fmt.Sprintf("%s/our-%s/pad=%d", st.name, role, pad), func(t *testing.T) {
					c := newCerts(t)
					var extra []string
					if pad > 0 {
						extra = []string{"-pad", strconv.Itoa(pad)}
					}
					l, tp := connectTapped(t, st, c, role, true, extra...)
					l.echoOn(t, 1<<20)
					l.closeTheirs()
					_ = l.ourEnd()
					evs := checkClean(t, st, l.p)
					fromPeer, toPeer := tp.largest()
					if role == "client" {
						fromPeer, toPeer = toPeer, fromPeer
					}
					if fromPeer != maxRecord || toPeer != maxRecord {
						t.Errorf("largest records: %d bytes from the peer, %d to it; want %d both ways", fromPeer, toPeer, maxRecord)
					}
					padded, _ := strconv.Atoi(field(evs, "done", "padded_to_max"))
					t.Logf("%d records padded to the maximum; largest %d bytes from the peer, %d to it", padded, fromPeer, toPeer)
					if pad == 16384 && padded == 0 {
						t.Errorf("%s peer padded no record to the maximum: %q", st.name, evs)
					}
				})
			}
		}
	}
}

// TestHBONEHelloRetryRequest: as server, our handshake asks the peer's
// client for another key share (it offered one only for a group we do not
// support); as client, the peer's server asks us (it takes only P-256, for
// which Go's client sends no share). Either way two ClientHellos pass.
func TestHBONEHelloRetryRequest(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			t.Run(st.name+"/our-"+role, func(t *testing.T) {
				c := newCerts(t)
				groups, want := st.hrrClientGroups, st.hrrClientWant
				if role == "client" {
					groups, want = st.hrrServerGroups, st.hrrServerWant
				}
				l := connect(t, st, c, role, "-groups", groups)
				l.echoOn(t, 64<<10)
				l.closeTheirs()
				_ = l.ourEnd()
				evs := checkClean(t, st, l.p)
				if hellos, group := field(evs, "handshake", "client_hellos"), field(evs, "handshake", "group"); hellos != "2" || group != want {
					t.Errorf("handshake: %s ClientHellos, group %s; want 2 (a HelloRetryRequest), %s: %q", hellos, group, want, evs)
				}
			})
		}
	}
}

// TestHBONEBrokenRecords: a tampered record gets bad_record_mac, which the
// peer reports; a record cut by FIN or RST ends the connection (after a FIN
// the peer still reads our close_notify). Another connection, open all the
// while, keeps working.
func TestHBONEBrokenRecords(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			for _, fault := range []string{"tamper", "fin", "rst"} {
				t.Run(st.name+"/our-"+role+"/"+fault, func(t *testing.T) {
					c := newCerts(t)
					other := connect(t, st, c, role)
					other.echoOn(t, 64<<10)
					extra := []string{"-tamper-at", "100000"}
					if fault != "tamper" {
						extra = []string{"-cut-at", "100000", "-cut", fault}
					}
					l := connect(t, st, c, role, extra...)
					if err := nettest.CheckEcho(l.stream(t), 1<<20, 1, 0); err == nil {
						t.Fatal("a transfer across the broken record succeeded")
					}
					end := l.ourEnd()
					evs, _ := l.p.wait()
					var pe *record.ProtocolError
					switch fault {
					case "tamper":
						if !errors.As(end, &pe) || pe.Alert != 20 {
							t.Errorf("our connection ended with %v, want a bad_record_mac protocol error", end)
						}
						if !hasEvent(evs, "tampered") || !hasEvent(evs, "alert_received 20") {
							t.Errorf("%s peer did not receive bad_record_mac: %q", st.name, evs)
						}
					case "fin":
						if !errors.Is(end, io.ErrUnexpectedEOF) {
							t.Errorf("our connection ended with %v, want io.ErrUnexpectedEOF", end)
						}
						if !hasEvent(evs, "cut fin") || !hasEvent(evs, "close_notify") || hasEvent(evs, st.truncation) {
							t.Errorf("%s peer, after its FIN, did not read our close_notify: %q", st.name, evs)
						}
					case "rst":
						// The reset reaches whichever of our reader and
						// writer meets it first.
						if !errIsAny(end, syscall.ECONNRESET, syscall.EPIPE, io.ErrUnexpectedEOF) {
							t.Errorf("our connection ended with %v, want a reset", end)
						}
						if !hasEvent(evs, "cut rst") {
							t.Errorf("%s peer did not cut: %q", st.name, evs)
						}
					}
					other.echoOn(t, 1<<20)
					other.closeTheirs()
					if err := other.ourEnd(); err != nil {
						t.Errorf("the other connection ended with %v", err)
					}
					checkClean(t, st, other.p)
				})
			}
		}
	}
}

// TestHBONEProtocolError: an HTTP/2 peer that breaks RFC 9113 (a
// WINDOW_UPDATE of 0 on the connection, a connection error PROTOCOL_ERROR
// by section 6.9) gets GOAWAY, then our close_notify, which the TLS peer
// reports.
func TestHBONEProtocolError(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			t.Run(st.name+"/our-"+role, func(t *testing.T) {
				c := newCerts(t)
				plain := nettest.Listen(t)
				var p *peer
				var ourEnd func() error
				if role == "server" {
					_, addr, end := serveOurs(t, c)
					p = startPeer(t, st, c, "client", addr, plain.Addr().String())
					ourEnd = func() error { return <-end }
				} else {
					p = startPeer(t, st, c, "server", "", plain.Addr().String())
					tc, err := dialTCP(net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
					if err != nil {
						t.Fatal(err)
					}
					conn := record.Client(tc, mtls.ClientConfig(c.ours, []string{c.theirSAN}))
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err = conn.HandshakeContext(ctx)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					cc, err := hbone.NewClientConn(conn, daemonH2)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { cc.Close() })
					ourEnd = func() error {
						<-cc.Done()
						return cc.Err()
					}
				}
				pc := acceptOne(t, plain, p)
				// The misbehaving HTTP/2 side, behind the peer's TLS.
				if role == "server" {
					if _, err := pc.Write([]byte(http2.ClientPreface)); err != nil {
						t.Fatal(err)
					}
				} else if _, err := io.ReadFull(pc, make([]byte, len(http2.ClientPreface))); err != nil {
					t.Fatal(err)
				}
				fr := http2.NewFramer(pc, pc)
				fr.AllowIllegalWrites = true
				if err := fr.WriteSettings(); err != nil {
					t.Fatal(err)
				}
				if err := fr.WriteWindowUpdate(0, 0); err != nil {
					t.Fatal(err)
				}
				var goAway *http2.GoAwayFrame
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						break
					}
					if g, ok := f.(*http2.GoAwayFrame); ok {
						goAway = g
					}
				}
				if goAway == nil || goAway.ErrCode != http2.ErrCodeProtocol {
					t.Errorf("no GOAWAY PROTOCOL_ERROR before the end: %v", goAway)
				}
				pc.Close()
				var ce *hbone.ConnError
				if err := ourEnd(); !errors.As(err, &ce) || ce.Code != http2.ErrCodeProtocol {
					t.Errorf("our connection ended with %v, want a PROTOCOL_ERROR connection error", err)
				}
				checkClean(t, st, p)
			})
		}
	}
}
