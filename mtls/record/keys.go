package record

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// Key log labels of the first application traffic secrets (the NSS key log
// format crypto/tls writes).
const (
	labelClientTraffic = "CLIENT_TRAFFIC_SECRET_0"
	labelServerTraffic = "SERVER_TRAFFIC_SECRET_0"
)

// keyLog is the KeyLogWriter of one connection. crypto/tls calls Write from
// the handshake goroutine, and the secrets are read once the handshake has
// returned on that same goroutine, so no lock is needed.
type keyLog struct {
	next   io.Writer // the KeyLogWriter the caller configured, if any
	client []byte    // CLIENT_TRAFFIC_SECRET_0
	server []byte    // SERVER_TRAFFIC_SECRET_0
}

// Write takes one key log line "LABEL <client random> <secret>\n". Lines it
// cannot parse are ignored: then a secret stays missing and the connection
// falls back to crypto/tls's record layer.
func (k *keyLog) Write(line []byte) (int, error) {
	if k.next != nil {
		if _, err := k.next.Write(line); err != nil {
			return 0, err
		}
	}
	fields := bytes.Fields(line)
	if len(fields) != 3 {
		return len(line), nil
	}
	var dst *[]byte
	switch string(fields[0]) {
	case labelClientTraffic:
		dst = &k.client
	case labelServerTraffic:
		dst = &k.server
	default:
		return len(line), nil
	}
	secret := make([]byte, hex.DecodedLen(len(fields[2])))
	if _, err := hex.Decode(secret, fields[2]); err != nil {
		return len(line), nil
	}
	*dst = secret
	return len(line), nil
}

// forget zeroes the captured secrets.
func (k *keyLog) forget() {
	clear(k.client)
	clear(k.server)
	k.client, k.server = nil, nil
}

// suite holds what the record layer needs of a cipher suite.
type suite struct {
	id     uint16
	keyLen int
	hash   func() hash.Hash
}

// suiteByID returns the suites the record layer protects itself; ok is false
// for any other (crypto/tls then keeps the connection's data).
func suiteByID(id uint16) (suite, bool) {
	switch id {
	case tls.TLS_AES_128_GCM_SHA256:
		return suite{id: id, keyLen: 16, hash: sha256.New}, true
	case tls.TLS_AES_256_GCM_SHA384:
		return suite{id: id, keyLen: 32, hash: sha512.New384}, true
	}
	return suite{}, false
}

// expandLabel is HKDF-Expand-Label (RFC 8446 section 7.1) with an empty
// context, the only form the record layer uses.
func (s suite) expandLabel(secret []byte, label string, length int) ([]byte, error) {
	const prefix = "tls13 "
	info := make([]byte, 0, 4+len(prefix)+len(label))
	info = append(info, byte(length>>8), byte(length), byte(len(prefix)+len(label)))
	info = append(info, prefix...)
	info = append(info, label...)
	info = append(info, 0) // empty context
	return hkdf.Expand(s.hash, secret, string(info), length)
}

// nextSecret is application_traffic_secret_N+1 (RFC 8446 section 7.2).
func (s suite) nextSecret(secret []byte) ([]byte, error) {
	return s.expandLabel(secret, "traffic upd", s.hash().Size())
}

// gcmIVLen is the per-record nonce length of both AES-GCM suites.
const gcmIVLen = 12

// direction is the protection state of one direction of the connection:
// the current traffic secret, its AEAD and its record sequence number.
type direction struct {
	suite  suite
	secret []byte
	aead   cipher.AEAD
	iv     [gcmIVLen]byte
	nonce  [gcmIVLen]byte // scratch: iv XOR seq
	seq    uint64
	// aad and ctrl are scratch space for a record header and a control
	// message: fields rather than locals, so that passing them to the AEAD
	// interface does not allocate.
	aad  [headerLen]byte
	ctrl [5]byte
}

// setSecret derives the key and IV of secret (RFC 8446 section 7.3) and
// restarts the sequence numbers. The previous secret is zeroed.
func (d *direction) setSecret(s suite, secret []byte) error {
	key, err := s.expandLabel(secret, "key", s.keyLen)
	if err != nil {
		return fmt.Errorf("record: deriving key: %w", err)
	}
	iv, err := s.expandLabel(secret, "iv", gcmIVLen)
	if err != nil {
		return fmt.Errorf("record: deriving iv: %w", err)
	}
	block, err := aes.NewCipher(key)
	clear(key)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	clear(d.secret)
	d.suite, d.secret, d.aead, d.seq = s, secret, aead, 0
	copy(d.iv[:], iv)
	return nil
}

// update moves to the next traffic secret (after a KeyUpdate).
func (d *direction) update() error {
	next, err := d.suite.nextSecret(d.secret)
	if err != nil {
		return fmt.Errorf("record: key update: %w", err)
	}
	return d.setSecret(d.suite, next)
}

// nextNonce returns the nonce of the next record (RFC 8446 section 5.3) and
// advances the sequence number.
func (d *direction) nextNonce() ([]byte, error) {
	if d.seq == ^uint64(0) {
		return nil, errSeqExhausted
	}
	d.nonce = d.iv
	for i := range 8 {
		d.nonce[gcmIVLen-1-i] ^= byte(d.seq >> (8 * i))
	}
	d.seq++
	return d.nonce[:], nil
}

var errSeqExhausted = errors.New("record: sequence number exhausted")
