package tlsinterop

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// useFD does what the engine will do before handing the connection to an
// event loop: dup the socket's descriptor, close the *net.TCPConn (taking
// the socket out of the runtime's poller), and switch conn to fd mode on
// the dup, which the test owns and closes at cleanup.
func useFD(t *testing.T, conn *record.Conn) int {
	t.Helper()
	fd := nettest.DetachFD(t, conn.NetConn().(*net.TCPConn))
	if err := conn.UseFD(fd); err != nil {
		t.Fatal(err)
	}
	return fd
}

// pollFD waits until fd has one of events and returns those it has (the
// test's stand-in for the event loop's epoll).
func pollFD(fd int, events int16) (int16, error) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	for {
		_, err := unix.Poll(pfd, int(peerTimeout.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err == nil && pfd[0].Revents == 0 {
			err = errors.New("poll: no readiness within the peer timeout")
		}
		return pfd[0].Revents, err
	}
}

// fdResult is what driveFD did: the SHA-256 and count of what it sent and
// of what it read up to the peer's close_notify.
type fdResult struct {
	sentSum, readSum []byte
	sent, read       int64
}

// driveFD runs our fd-mode end as an event loop would, in one goroutine
// and by readiness only: it writes n pseudo-random bytes with TryWrite
// (TryFlush when the socket is full), calls mid once half are written,
// then TryClose (close_notify) and shuts the socket down for writing; at
// the same time it reads with TryRead until the peer's close_notify. The
// second half is written only once waitRead bytes have been read.
func driveFD(conn *record.Conn, fd int, n int, seed uint64, mid func() error, waitRead int64) (fdResult, error) {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(r.Uint32())
	}
	var res fdResult
	ss := sha256.Sum256(out)
	res.sentSum = ss[:]
	hin := sha256.New()
	buf := make([]byte, 64<<10)
	sent := 0
	held, closed, eof := false, false, false
	midDone := mid == nil
	for {
		for !held && !closed {
			if sent >= len(out)/2 && res.read < waitRead {
				break
			}
			if sent == len(out) {
				closed = true
				held = !conn.TryClose()
				if !held {
					if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
						return res, err
					}
				}
				break
			}
			k := min(len(out)-sent, record.MaxTryWrite)
			ok, queued, err := conn.TryWrite(out[sent : sent+k])
			if err != nil {
				return res, fmt.Errorf("TryWrite after %d bytes: %w", sent, err)
			}
			if !ok && !queued {
				return res, errors.New("TryWrite refused with nothing held")
			}
			if ok {
				sent += k
				res.sent += int64(k)
			}
			held = queued
			if !midDone && sent >= len(out)/2 {
				midDone = true
				if err := mid(); err != nil {
					return res, err
				}
				held = true // what it wrote may be held: TryFlush tells
			}
		}
		for !eof {
			k, err := conn.TryRead(buf)
			hin.Write(buf[:k])
			res.read += int64(k)
			if err == record.ErrWouldBlock {
				break
			}
			if err == io.EOF {
				eof = true
				break
			}
			if err != nil {
				return res, fmt.Errorf("TryRead after %d bytes: %w", res.read, err)
			}
			if conn.Drained() {
				break
			}
		}
		if eof && closed && !held {
			res.readSum = hin.Sum(nil)
			return res, nil
		}
		if !held && !closed && (sent < len(out)/2 || res.read >= waitRead) {
			// What was just read let the second half go: write it now
			// rather than wait for readiness nothing may bring (the
			// peer's close_notify may have come in this very pass, and
			// then the poll below would wait on no event at all).
			continue
		}
		var ev int16
		if !eof {
			ev |= unix.POLLIN
		}
		if held {
			ev |= unix.POLLOUT
		}
		rev, err := pollFD(fd, ev)
		if err != nil {
			return res, err
		}
		if held && rev&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0 {
			done, err := conn.TryFlush()
			if err != nil {
				return res, fmt.Errorf("TryFlush: %w", err)
			}
			held = !done
			if done && closed {
				if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
					return res, err
				}
			}
		}
	}
}

// TestRecordFDBothWays is TestRecordBothWays with our record.Conn in fd
// mode (UseFD, driven by readiness in one goroutine): data flows both ways
// at once, checksummed, while one side moves its keys on in the middle,
// asking the other to follow or not: ours with TryKeyUpdate, or the peer
// (our TryRead takes its KeyUpdate; asked, our next TryWrite answers). Our
// TryClose sends close_notify, the peer's arrives as io.EOF through
// TryRead, and the foreign stack reports a clean end and the KeyUpdates it
// received from us.
func TestRecordFDBothWays(t *testing.T) {
	const n = 8 << 20
	for _, st := range stacks {
		for _, role := range roles {
			for _, updater := range []string{"ours", "theirs"} {
				for _, request := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/our-%s/%s-keyupdate-request=%v", st.name, role, updater, request), func(t *testing.T) {
						c := newCerts(t)
						var extra []string
						if updater == "theirs" {
							extra = []string{"-keyupdate-at", strconv.Itoa(1 << 20)}
							if request {
								extra = append(extra, "-keyupdate-request")
							}
						}
						conn, plain, p := rawConnect(t, st, c, role, extra...)
						fd := useFD(t, conn)
						var mid func() error
						var waitRead int64
						if updater == "ours" {
							mid = func() error { return conn.TryKeyUpdate(request) }
						} else {
							// Our second half goes after the peer's
							// KeyUpdate, so that a requested answer is
							// due (before our next data, RFC 8446
							// section 4.6.3) whatever the timing.
							waitRead = 2 << 20
						}
						type result struct {
							sum []byte
							n   int64
							err error
						}
						toPeer, sentTheirs := make(chan result, 1), make(chan result, 1)
						go func() {
							sum, err := oneWay(plain, n, 2, nil)
							sentTheirs <- result{sum, n, err}
						}()
						go func() {
							sum, m, err := readSum(plain)
							toPeer <- result{sum, m, err}
						}()
						ours, err := driveFD(conn, fd, n, 1, mid, waitRead)
						if err != nil {
							// End both of the peer's connections so that it
							// exits and its report says what it saw.
							_ = unix.Shutdown(fd, unix.SHUT_RDWR)
							plain.Close()
							evs, werr := p.wait()
							t.Fatalf("our fd-mode end: %v (read %d, sent %d); %s peer (exit %v): %q", err, ours.read, ours.sent, st.name, werr, evs)
						}
						if r := <-toPeer; r.err != nil || r.n != n || !bytes.Equal(r.sum, ours.sentSum) {
							t.Errorf("to the peer: received %d of %d bytes (%v), checksums equal: %v", r.n, n, r.err, bytes.Equal(r.sum, ours.sentSum))
						}
						if s := <-sentTheirs; s.err != nil || ours.read != n || !bytes.Equal(s.sum, ours.readSum) {
							t.Errorf("from the peer: sent %v, we read %d bytes, checksums equal: %v", s.err, ours.read, bytes.Equal(s.sum, ours.readSum))
						}
						if err := conn.Close(); err != nil {
							t.Errorf("close: %v", err)
						}
						plain.Close()
						evs := checkClean(t, st, p)
						got, _ := strconv.Atoi(field(evs, "done", "keyupdates_received"))
						switch {
						case updater == "theirs" && !hasEvent(evs, "keyupdate_sent"):
							t.Errorf("%s peer sent no KeyUpdate: %q", st.name, evs)
						case (updater == "ours" || request) && got < 1:
							t.Errorf("%s peer received %d KeyUpdates from us, want at least 1: %q", st.name, got, evs)
						case updater == "theirs" && !request && got != 0:
							t.Errorf("%s peer received %d KeyUpdates from us, want none: %q", st.name, got, evs)
						}
					})
				}
			}
		}
	}
}

// TestRecordFDTampered: a record the peer tampers with fails our TryRead
// with bad_record_mac, and TryClose delivers that alert: the foreign stack
// reports receiving it.
func TestRecordFDTampered(t *testing.T) {
	for _, st := range stacks {
		for _, role := range roles {
			t.Run(st.name+"/our-"+role, func(t *testing.T) {
				c := newCerts(t)
				conn, plain, p := rawConnect(t, st, c, role, "-tamper-at", "100000")
				fd := useFD(t, conn)
				sent := make(chan error, 1)
				go func() {
					_, err := oneWay(plain, 1<<20, 2, nil)
					sent <- err
				}()
				go func() { _, _ = io.Copy(io.Discard, plain) }()
				// Read only, until the tampered record.
				buf := make([]byte, 64<<10)
				var err error
				for {
					var k int
					k, err = conn.TryRead(buf)
					if err == record.ErrWouldBlock || err == nil && k > 0 && conn.Drained() {
						if _, perr := pollFD(fd, unix.POLLIN); perr != nil {
							t.Fatal(perr)
						}
						continue
					}
					if err != nil {
						break
					}
				}
				var pe *record.ProtocolError
				if !errors.As(err, &pe) || pe.Alert != 20 {
					t.Fatalf("our fd-mode end: %v, want a bad_record_mac protocol error", err)
				}
				for !conn.TryClose() {
					if _, err := pollFD(fd, unix.POLLOUT); err != nil {
						t.Fatal(err)
					}
				}
				// The peer may have gone already: it stops at our alert.
				_ = unix.Shutdown(fd, unix.SHUT_RDWR)
				evs, _ := p.wait()
				if !hasEvent(evs, "tampered") || !hasEvent(evs, "alert_received 20") {
					t.Errorf("%s peer did not receive bad_record_mac: %q", st.name, evs)
				}
				plain.Close()
				<-sent
			})
		}
	}
}
