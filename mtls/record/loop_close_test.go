package record

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Closing in fd mode: TryClose's owed alert and close_notify, also behind
// held records.

// TestTryCloseOwedAlert: TryClose alone (no TryWrite first) sends the
// fatal alert a failed TryRead owes, and only once.
func TestTryCloseOwedAlert(t *testing.T) {
	srv, fd, peer := fdPair(t, false, kindOurs)
	cli := peer.(*Conn)
	b := sealed(t, cli, typeApplicationData, []byte("tampered"))
	b[7] ^= 1
	if _, err := cli.raw.Write(b); err != nil {
		t.Fatal(err)
	}
	_, err := fdReadAll(t, srv, fd)
	var pe *ProtocolError
	if !errors.As(err, &pe) || alert(pe.Alert) != alertBadRecordMAC {
		t.Fatalf("TryRead: %v, want bad_record_mac", err)
	}
	for !srv.TryClose() {
		waitFD(t, fd, unix.POLLOUT)
	}
	if !srv.TryClose() {
		t.Fatal("a second TryClose has something to send")
	}
	if _, err := io.ReadAll(cli); !errors.Is(err, AlertError(alertBadRecordMAC)) {
		t.Fatalf("peer read %v, want bad_record_mac", err)
	}
}

// TestTryCloseOwedAlertTLSPeer: a crypto/tls peer receives the fatal
// alert TryClose sends after a failed TryRead (here unexpected_message, for
// a record of an unknown type the peer's socket carries).
func TestTryCloseOwedAlertTLSPeer(t *testing.T) {
	for _, client := range []bool{true, false} {
		t.Run(map[bool]string{true: "our-client", false: "our-server"}[client], func(t *testing.T) {
			c, fd, peer := fdPair(t, client, kindTLS)
			// The peer's raw socket: the tls.Conn's NetConn.
			raw := peer.(*tls.Conn).NetConn()
			if _, err := raw.Write([]byte{24, 3, 3, 0, 1, 0}); err != nil {
				t.Fatal(err)
			}
			_, err := fdReadAll(t, c, fd)
			var pe *ProtocolError
			if !errors.As(err, &pe) || alert(pe.Alert) != alertUnexpectedMessage {
				t.Fatalf("TryRead: %v, want unexpected_message", err)
			}
			for !c.TryClose() {
				waitFD(t, fd, unix.POLLOUT)
			}
			_, err = io.ReadAll(peer)
			if err == nil || !strings.Contains(err.Error(), "unexpected message") {
				t.Fatalf("crypto/tls peer read %v, want the unexpected_message alert", err)
			}
		})
	}
}

// TestTryCloseNotify: after data, TryClose's close_notify reaches a
// crypto/tls peer, as either end. A bogus record written on the socket
// behind it proves it: a peer that had not read close_notify would fail on
// that record instead of ending cleanly.
func TestTryCloseNotify(t *testing.T) {
	for _, client := range []bool{true, false} {
		t.Run(map[bool]string{true: "our-client", false: "our-server"}[client], func(t *testing.T) {
			c, fd, peer := fdPair(t, client, kindTLS)
			msg := bytes.Repeat([]byte("before close "), 5000)
			got := make(chan []byte, 1)
			errc := make(chan error, 1)
			go func() {
				b, err := io.ReadAll(peer)
				got <- b
				errc <- err
			}()
			fdWriteAll(t, c, fd, msg)
			for !c.TryClose() {
				waitFD(t, fd, unix.POLLOUT)
			}
			if _, err := unix.Write(fd, []byte{typeApplicationData, 3, 3, 0, 1, 0}); err != nil {
				t.Fatal(err)
			}
			if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			if b, err := <-got, <-errc; err != nil || !bytes.Equal(b, msg) {
				t.Fatalf("peer read %d bytes, %v; want %d and close_notify", len(b), err, len(msg))
			}
			if ok, _, err := c.TryWrite([]byte("late")); !ok || !errors.Is(err, errShutdown) {
				t.Fatalf("TryWrite after TryClose = %v, %v; want true, %v", ok, err, errShutdown)
			}
		})
	}
}

// TestTryWriteFDHeldThenTryClose: close_notify goes behind held records;
// the peer reads all of them, then io.EOF.
func TestTryWriteFDHeldThenTryClose(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte("held records "), 4096)
	var sent []byte
	for {
		ok, queued, err := c.TryWrite(p)
		if err != nil || !ok {
			t.Fatalf("TryWrite = %v, %v, %v", ok, queued, err)
		}
		sent = append(sent, p...)
		if queued {
			break
		}
	}
	if c.TryClose() {
		t.Fatal("TryClose sent everything to a socket that was full")
	}
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		done <- b
	}()
	fdFlush(t, c, fd)
	if b := <-done; !bytes.Equal(b, sent) {
		t.Fatalf("peer read %d bytes before EOF, want %d", len(b), len(sent))
	}
}
