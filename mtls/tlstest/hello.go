package tlstest

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ClientHello returns a TLS 1.3 ClientHello record offering exactly suites
// (IDs, in order), with an X25519 key share, ECDSA P-256 and RSA-PSS
// signatures and ALPN h2: what crypto/tls's client cannot send, since it
// always offers all three TLS 1.3 suites. A test writes it to a server and
// reads the answer with ReadAlert to see how the server refuses it.
func ClientHello(suites []uint16) ([]byte, error) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	u16 := func(b []byte, v int) []byte { return binary.BigEndian.AppendUint16(b, uint16(v)) }
	ext := func(b []byte, typ int, body []byte) []byte { return append(u16(u16(b, typ), len(body)), body...) }

	var exts []byte
	exts = ext(exts, 43, []byte{2, 0x03, 0x04})                // supported_versions: TLS 1.3
	exts = ext(exts, 10, []byte{0, 2, 0x00, 0x1d})             // supported_groups: x25519
	exts = ext(exts, 13, []byte{0, 4, 0x04, 0x03, 0x08, 0x04}) // signature_algorithms
	pub := key.PublicKey().Bytes()
	share := u16(u16(nil, 0x001d), len(pub))
	share = append(share, pub...)
	exts = ext(exts, 51, append(u16(nil, len(share)), share...)) // key_share
	exts = ext(exts, 16, []byte{0, 3, 2, 'h', '2'})              // ALPN h2

	body := []byte{0x03, 0x03} // legacy_version
	random := make([]byte, 32)
	rand.Read(random)
	body = append(body, random...)
	body = append(body, 0) // empty legacy_session_id
	body = u16(body, 2*len(suites))
	for _, s := range suites {
		body = u16(body, int(s))
	}
	body = append(body, 1, 0) // compression: null
	body = u16(body, len(exts))
	body = append(body, exts...)

	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	rec := append([]byte{22, 0x03, 0x01}, byte(len(hs)>>8), byte(len(hs)))
	return append(rec, hs...), nil
}

// Alert descriptions ReadAlert reports (RFC 8446, section 6).
const (
	AlertHandshakeFailure = 40
	AlertBadCertificate   = 42
	AlertInternalError    = 80
)

// ReadAlert reads the first record r sends and returns the description of
// the fatal alert it is; anything else is an error.
func ReadAlert(r io.Reader) (byte, error) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint16(hdr[3:]))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	if hdr[0] != 21 {
		return 0, fmt.Errorf("record of type %d, not an alert", hdr[0])
	}
	if n != 2 || body[0] != 2 {
		return 0, errors.New("malformed or non-fatal alert")
	}
	return body[1], nil
}
