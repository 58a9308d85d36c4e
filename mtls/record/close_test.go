package record

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"time"
)

// setCloseAlertTimeout changes closeAlertTimeout for one test.
func setCloseAlertTimeout(t *testing.T, d time.Duration) {
	t.Helper()
	old := closeAlertTimeout
	closeAlertTimeout = d
	t.Cleanup(func() { closeAlertTimeout = old })
}

// waitWriteHeld returns once c's write lock is held (by a Write that blocks
// on a peer that does not read yet).
func waitWriteHeld(c *Conn) {
	for c.wmu.TryLock() {
		c.wmu.Unlock()
		runtime.Gosched()
	}
}

// TestCloseAfterEveryEnding: however the connection ended, Close leaves
// the peer the alert it is owed: close_notify after the peer closed first,
// after the peer cut the connection, after a local close; bad_record_mac
// after a tampered record; record_overflow after an oversized one. The
// peer reads the alert (io.EOF for close_notify), never a bare end.
func TestCloseAfterEveryEnding(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end makes srv's Read fail the way the case says (cli is the
		// peer); nil: srv closes first.
		end       func(t *testing.T, cli, srv *Conn)
		wantRead  error // what srv's Read got
		wantAlert alert // what cli then reads: an AlertError, or io.EOF for close_notify
	}{
		{name: "peer sent close_notify first", end: func(t *testing.T, cli, srv *Conn) {
			if err := cli.CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}, wantRead: io.EOF, wantAlert: alertCloseNotify},
		{name: "peer half-closed TCP without close_notify", end: func(t *testing.T, cli, srv *Conn) {
			if err := cli.raw.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}, wantRead: io.EOF, wantAlert: alertCloseNotify},
		{name: "peer cut a record", end: func(t *testing.T, cli, srv *Conn) {
			if _, err := cli.raw.Write(sealed(t, cli, typeApplicationData, []byte("cut"))[:9]); err != nil {
				t.Fatal(err)
			}
			if err := cli.raw.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}, wantRead: io.ErrUnexpectedEOF, wantAlert: alertCloseNotify},
		{name: "tampered record", end: func(t *testing.T, cli, srv *Conn) {
			b := sealed(t, cli, typeApplicationData, []byte("tampered"))
			b[7] ^= 1
			if _, err := cli.raw.Write(b); err != nil {
				t.Fatal(err)
			}
		}, wantAlert: alertBadRecordMAC},
		{name: "oversized padded record", end: func(t *testing.T, cli, srv *Conn) {
			if _, err := cli.raw.Write(sealedInner(t, cli, padded([]byte("x"), typeApplicationData, maxPlaintext+2))); err != nil {
				t.Fatal(err)
			}
		}, wantAlert: alertRecordOverflow},
		{name: "local close", wantAlert: alertCloseNotify},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pair(t, kindOurs, kindOurs, nil)
			cli, srv := c.(*Conn), s.(*Conn)
			if tc.end != nil {
				tc.end(t, cli, srv)
				_, err := io.ReadAll(srv)
				var pe *ProtocolError
				switch {
				case tc.wantRead == nil:
					if !errors.As(err, &pe) || alert(pe.Alert) != tc.wantAlert {
						t.Fatalf("server read %v, want a protocol error with %s", err, tc.wantAlert)
					}
				case tc.wantRead == io.EOF && err != nil, tc.wantRead != io.EOF && !errors.Is(err, tc.wantRead):
					t.Fatalf("server read %v, want %v", err, tc.wantRead)
				}
			}
			if err := srv.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			_, err := io.ReadAll(cli)
			if tc.wantAlert == alertCloseNotify {
				if err != nil {
					t.Fatalf("peer read %v, want close_notify (io.EOF)", err)
				}
				return
			}
			if !errors.Is(err, AlertError(tc.wantAlert)) {
				t.Fatalf("peer read %v, want the alert %s", err, tc.wantAlert)
			}
		})
	}
}

// TestCloseWaitsForWrite: Close during a Write lets the Write finish (within
// closeAlertTimeout) and sends close_notify after its records, so the
// peer reads all the data and then io.EOF, not a cut connection.
func TestCloseWaitsForWrite(t *testing.T) {
	setCloseAlertTimeout(t, time.Minute) // a hang guard here: the peer reads
	c, s := pair(t, kindOurs, kindOurs, nil)
	cli, srv := c.(*Conn), s.(*Conn)
	msg := bytes.Repeat([]byte("w"), 8<<20) // more than the socket buffers hold
	werr := make(chan error, 1)
	go func() {
		_, err := srv.Write(msg)
		werr <- err
	}()
	waitWriteHeld(srv)
	cerr := make(chan error, 1)
	go func() { cerr <- srv.Close() }()
	for !srv.closed.Load() {
		runtime.Gosched()
	}
	got, err := io.ReadAll(cli)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("peer read %d bytes, %v; want %d bytes and io.EOF", len(got), err, len(msg))
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := <-cerr; err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestCloseBoundedOnStalledPeer: a peer that never reads cannot hold Close
// (nor the Write it interrupts) past closeAlertTimeout. The test's end is
// the proof; it would hang otherwise.
func TestCloseBoundedOnStalledPeer(t *testing.T) {
	setCloseAlertTimeout(t, 20*time.Millisecond)
	for _, k := range []kind{kindOurs, kindFallback} {
		t.Run(string(k), func(t *testing.T) {
			_, s := pair(t, k, k, nil)
			werr := make(chan error, 1)
			go func() {
				_, err := s.Write(make([]byte, 64<<20))
				werr <- err
			}()
			if k == kindOurs {
				waitWriteHeld(s.(*Conn))
			}
			_ = s.Close() // it fails: the alert could not be sent
			if err := <-werr; err == nil {
				t.Fatal("write to a stalled peer succeeded")
			}
		})
	}
}
