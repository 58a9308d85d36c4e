package record

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// sealed returns the wire bytes of a record c would send with content type
// typ (the byte after content in the inner plaintext), advancing c's write
// sequence number.
func sealed(t testing.TB, c *Conn, typ byte, content []byte) []byte {
	t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b, err := c.appendRecordLocked(nil, typ, content)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sealedInner returns the wire bytes of a record whose inner plaintext
// (content, type byte and padding) is exactly inner, which the writer's own
// path cannot produce when inner is empty or oversized.
func sealedInner(t testing.TB, c *Conn, inner []byte) []byte {
	t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	nonce, err := c.out.nextNonce()
	if err != nil {
		t.Fatal(err)
	}
	clen := len(inner) + tagLen
	hdr := []byte{typeApplicationData, 3, 3, byte(clen >> 8), byte(clen)}
	return c.out.aead.Seal(hdr, nonce, inner, hdr)
}

// padded returns an inner plaintext of n bytes: content, type typ, zeros.
func padded(content []byte, typ byte, n int) []byte {
	b := make([]byte, n)
	copy(b, content)
	b[len(content)] = typ
	return b
}

func keyUpdateMsg(req byte) []byte { return []byte{hsKeyUpdate, 0, 0, 1, req} }

// hostileCase is one crafted stream a peer sends after a real handshake,
// and how the read side must end.
type hostileCase struct {
	name string
	// wire builds the bytes the client puts on the socket.
	wire     func(t *testing.T, c *Conn) []byte
	closeRaw bool // then shut the sender's socket for writing
	// toClient sends wire from the server to the client (messages
	// only a server may send); else the client sends it.
	toClient  bool
	want      string // data the server reads before the end
	wantAlert alert  // a *ProtocolError with this alert; 0: see wantErr
	wantErr   error  // errors.Is match when wantAlert is 0
}

// hostileCases are the streams TestHostileRecords (blocking Read) and
// TestHostileRecordsFD (TryRead) feed to the read side.
func hostileCases() []hostileCase {
	flip := func(b []byte, i int) []byte { b[i] ^= 0x40; return b }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	return []hostileCase{
		{name: "flipped ciphertext byte", wire: func(t *testing.T, c *Conn) []byte {
			return flip(sealed(t, c, typeApplicationData, []byte("hello world")), 8)
		}, wantAlert: alertBadRecordMAC},
		{name: "flipped tag byte", wire: func(t *testing.T, c *Conn) []byte {
			b := sealed(t, c, typeApplicationData, []byte("hello world"))
			return flip(b, len(b)-1)
		}, wantAlert: alertBadRecordMAC},
		{name: "flipped header version", wire: func(t *testing.T, c *Conn) []byte {
			return flip(sealed(t, c, typeApplicationData, []byte("hello")), 2)
		}, wantAlert: alertBadRecordMAC},
		{name: "replayed record", wire: func(t *testing.T, c *Conn) []byte {
			b := sealed(t, c, typeApplicationData, []byte("once"))
			return cat(b, b)
		}, want: "once", wantAlert: alertBadRecordMAC},
		{name: "oversized length", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeApplicationData, 3, 3, 0x41, 0x01, 0, 0, 0}
		}, wantAlert: alertRecordOverflow},
		{name: "too short for a tag", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeApplicationData, 3, 3, 0, 5, 1, 2, 3, 4, 5}
		}, wantAlert: alertBadRecordMAC},
		{name: "empty ciphertext", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeApplicationData, 3, 3, 0, 0}
		}, wantAlert: alertBadRecordMAC},
		{name: "authentic tag with empty inner plaintext", wire: func(t *testing.T, c *Conn) []byte {
			return sealedInner(t, c, nil)
		}, wantAlert: alertUnexpectedMessage},
		{name: "ciphertext of 2^14+256 bytes, inner plaintext too long", wire: func(t *testing.T, c *Conn) []byte {
			// The largest length allowed on the wire; its inner plaintext
			// (2^14+240 bytes) is then too long.
			return sealedInner(t, c, padded([]byte("x"), typeApplicationData, maxCiphertext-tagLen))
		}, wantAlert: alertRecordOverflow},
		{name: "ciphertext of 2^14+257 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return sealedInner(t, c, padded([]byte("x"), typeApplicationData, maxCiphertext-tagLen+1))
		}, wantAlert: alertRecordOverflow},
		{name: "padded inner plaintext of 2^14+2 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return sealedInner(t, c, padded([]byte("small"), typeApplicationData, maxPlaintext+2))
		}, wantAlert: alertRecordOverflow},
		{name: "padded inner plaintext of 2^14+1 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealedInner(t, c, padded([]byte("small"), typeApplicationData, maxPlaintext+1)),
				sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: "small", wantErr: io.EOF},
		{name: "full record of 2^14 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeApplicationData, bytes.Repeat([]byte("f"), maxPlaintext)),
				sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: strings.Repeat("f", maxPlaintext), wantErr: io.EOF},
		{name: "padding only", wire: func(t *testing.T, c *Conn) []byte {
			return sealedInner(t, c, make([]byte, 300))
		}, wantAlert: alertUnexpectedMessage},
		{name: "plaintext alert record", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeAlert, 3, 3, 0, 2, 2, 20}
		}, wantAlert: alertUnexpectedMessage},
		{name: "unknown outer type", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{24, 3, 3, 0, 1, 0}
		}, wantAlert: alertUnexpectedMessage},
		{name: "inner heartbeat type", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, 24, []byte{1, 0, 0})
		}, wantAlert: alertUnexpectedMessage},
		{name: "two alerts in one record", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeAlert, []byte{1, 0, 1, 0})
		}, wantAlert: alertDecodeError},
		{name: "NewSessionTicket from the client", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, []byte{hsNewSessionTicket, 0, 0, 1, 9})
		}, wantAlert: alertUnexpectedMessage},
		{name: "CertificateRequest after the handshake", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			// We never offer post_handshake_auth (RFC 8446 section 4.6.2).
			return sealed(t, c, typeHandshake, []byte{13, 0, 0, 0})
		}, wantAlert: alertUnexpectedMessage},
		{name: "plaintext handshake record", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeHandshake, 3, 3, 0, 1, 1}
		}, wantAlert: alertUnexpectedMessage},
		{name: "change_cipher_spec after the handshake", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeChangeCipherSpec, 3, 3, 0, 1, 1}
		}, wantAlert: alertUnexpectedMessage},
		{name: "inner change_cipher_spec", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeChangeCipherSpec, []byte{1})
		}, wantAlert: alertUnexpectedMessage},
		{name: "inner unknown type", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, 99, []byte("x"))
		}, wantAlert: alertUnexpectedMessage},
		{name: "no content type", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, 0, []byte{0, 0, 0})
		}, wantAlert: alertUnexpectedMessage},
		{name: "content over 16 KiB", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeApplicationData, make([]byte, maxPlaintext+1))
		}, wantAlert: alertRecordOverflow},
		{name: "alert of 3 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeAlert, []byte{1, 0, 0})
		}, wantAlert: alertDecodeError},
		{name: "empty handshake record", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, nil)
		}, wantAlert: alertUnexpectedMessage},
		{name: "ClientHello after the handshake", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, []byte{1, 0, 0, 0})
		}, wantAlert: alertUnexpectedMessage},
		{name: "KeyUpdate not last in its record", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, cat(keyUpdateMsg(0), []byte{hsNewSessionTicket, 0, 0, 0}))
		}, wantAlert: alertUnexpectedMessage},
		{name: "KeyUpdate request_update 2", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, keyUpdateMsg(2))
		}, wantAlert: alertIllegalParameter},
		{name: "KeyUpdate of 2 bytes", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, []byte{hsKeyUpdate, 0, 0, 2, 0, 0})
		}, wantAlert: alertDecodeError},
		{name: "handshake message over the cap", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeHandshake, []byte{hsNewSessionTicket, 1, 0, 0})
		}, wantAlert: alertUnexpectedMessage},
		{name: "data inside a split handshake message", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeHandshake, []byte{hsNewSessionTicket, 0, 0, 10, 1}),
				sealed(t, c, typeApplicationData, []byte("x")))
		}, wantAlert: alertUnexpectedMessage},
		{name: "endless empty records", wire: func(t *testing.T, c *Conn) []byte {
			var b []byte
			for range maxIdleRecords + 1 {
				b = append(b, sealed(t, c, typeApplicationData, nil)...)
			}
			return b
		}, wantAlert: alertUnexpectedMessage},
		{name: "peer's fatal alert", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeApplicationData, []byte("before")), sealed(t, c, typeAlert, []byte{2, 80}))
		}, want: "before", wantErr: AlertError(alertInternalError)},
		{name: "truncated inside a record", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeApplicationData, []byte("hello world"))[:10]
		}, closeRaw: true, wantErr: io.ErrUnexpectedEOF},
		{name: "truncated inside a header", wire: func(t *testing.T, c *Conn) []byte {
			return []byte{typeApplicationData, 3}
		}, closeRaw: true, wantErr: io.ErrUnexpectedEOF},
		{name: "end without close_notify at a record boundary", wire: func(t *testing.T, c *Conn) []byte {
			return sealed(t, c, typeApplicationData, []byte("all"))
		}, closeRaw: true, want: "all", wantErr: io.EOF},
		{name: "data after close_notify is ignored", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeAlert, []byte{1, 0}), sealed(t, c, typeApplicationData, []byte("late")))
		}, wantErr: io.EOF},
		{name: "user_canceled then close_notify", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeApplicationData, []byte("a")), sealed(t, c, typeAlert, []byte{1, 90}),
				sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: "a", wantErr: io.EOF},
		{name: "padding and empty records", wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, 0, []byte("pad\x17\x00\x00\x00")), sealed(t, c, typeApplicationData, nil),
				sealed(t, c, typeApplicationData, []byte("ded")), sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: "padded", wantErr: io.EOF},
		{name: "ticket split across records", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			return cat(sealed(t, c, typeHandshake, []byte{hsNewSessionTicket, 0, 0, 6, 1, 2}),
				sealed(t, c, typeHandshake, []byte{3, 4}), sealed(t, c, typeHandshake, []byte{5, 6}),
				sealed(t, c, typeApplicationData, []byte("ok")), sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: "ok", wantErr: io.EOF},
		{name: "ticket and KeyUpdate in one record", toClient: true, wire: func(t *testing.T, c *Conn) []byte {
			b := sealed(t, c, typeHandshake, cat([]byte{hsNewSessionTicket, 0, 0, 1, 9}, keyUpdateMsg(1)))
			c.wmu.Lock()
			err := c.out.update()
			c.wmu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			return cat(b, sealed(t, c, typeApplicationData, []byte("new keys")), sealed(t, c, typeAlert, []byte{1, 0}))
		}, want: "new keys", wantErr: io.EOF},
	}
}

// checkHostileEnd checks how a read side ended on tc's stream: the data it
// returned and its error.
func checkHostileEnd(t *testing.T, tc hostileCase, got []byte, err error) {
	t.Helper()
	if string(got) != tc.want {
		t.Errorf("read %q, want %q", got, tc.want)
	}
	var pe *ProtocolError
	switch {
	case tc.wantAlert != 0:
		if !errors.As(err, &pe) || alert(pe.Alert) != tc.wantAlert {
			t.Fatalf("error %v, want a protocol error with alert %s", err, tc.wantAlert)
		}
	case !errors.Is(err, tc.wantErr):
		t.Fatalf("error %v, want %v", err, tc.wantErr)
	}
}

// TestHostileRecords sends crafted records to our server after a real
// handshake: each must end in a clear error (or be handled), never a panic,
// and a protocol error is answered with its alert on Close.
func TestHostileRecords(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pair(t, kindOurs, kindOurs, nil)
			// cli sends the crafted bytes, srv reads them.
			cli, srv := c.(*Conn), s.(*Conn)
			if tc.toClient {
				cli, srv = srv, cli
			}
			if _, err := cli.raw.Write(tc.wire(t, cli)); err != nil {
				t.Fatal(err)
			}
			if tc.closeRaw {
				if err := cli.raw.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			got, err := io.ReadAll(srv)
			if err == nil {
				err = io.EOF // ReadAll's way of saying io.EOF
			}
			checkHostileEnd(t, tc, got, err)
			// The error is sticky.
			if _, err2 := srv.Read(make([]byte, 10)); err2 == nil {
				t.Fatal("read after the error succeeded")
			}
			if tc.wantAlert == 0 {
				return
			}
			// The server owes the peer the alert: Write fails and sends it.
			if _, err := srv.Write([]byte("x")); err == nil {
				t.Fatal("write after a protocol error succeeded")
			}
			_, err = io.ReadAll(cli)
			if !errors.Is(err, AlertError(tc.wantAlert)) {
				t.Fatalf("client read %v, want the alert %s", err, tc.wantAlert)
			}
		})
	}
}
