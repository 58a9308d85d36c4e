package load

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderLen is the size of the header a client sends first on every
// connection (unless Raw).
const HeaderLen = 16

// MaxMessage bounds request and response sizes, so that a header from the
// network cannot make the server allocate without limit.
const MaxMessage = 16 << 20

var magic = [4]byte{'z', 'l', 'd', '1'}

// Op tells the server how to treat a connection.
type Op byte

// The server's operations.
const (
	// OpEcho echoes every byte and half-closes after the client does.
	OpEcho Op = 'E'
	// OpSink reads and discards until EOF, then answers the byte count as an
	// 8-byte big-endian integer and closes: the client learns how much
	// arrived, not how much it managed to buffer.
	OpSink Op = 'S'
	// OpRR reads requests of Req bytes and answers each with Resp bytes until
	// the client half-closes.
	OpRR Op = 'R'
	// OpOnce reads one request of Req bytes, answers Resp bytes and closes
	// first, so the TIME_WAIT state stays on the server side and a connection
	// rate test does not run out of client ports.
	OpOnce Op = 'C'
)

// ErrBadHeader reports a connection that did not start with a valid header.
var ErrBadHeader = errors.New("load: bad header")

// Header is the first thing a client sends.
type Header struct {
	Op   Op
	Req  uint32
	Resp uint32
}

// Marshal encodes h.
func (h Header) Marshal() [HeaderLen]byte {
	var b [HeaderLen]byte
	copy(b[:4], magic[:])
	b[4] = byte(h.Op)
	binary.BigEndian.PutUint32(b[8:12], h.Req)
	binary.BigEndian.PutUint32(b[12:16], h.Resp)
	return b
}

// ParseHeader decodes and validates a header from the network.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrBadHeader, len(b))
	}
	if [4]byte(b[:4]) != magic {
		return Header{}, fmt.Errorf("%w: magic %q", ErrBadHeader, b[:4])
	}
	if b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return Header{}, fmt.Errorf("%w: reserved bytes set", ErrBadHeader)
	}
	h := Header{Op: Op(b[4]), Req: binary.BigEndian.Uint32(b[8:12]), Resp: binary.BigEndian.Uint32(b[12:16])}
	switch h.Op {
	case OpEcho, OpSink:
		// No sizes: a header has one encoding (found by FuzzParseHeader).
		if h.Req != 0 || h.Resp != 0 {
			return Header{}, fmt.Errorf("%w: sizes %d/%d on op %q, want none", ErrBadHeader, h.Req, h.Resp, b[4])
		}
	case OpRR, OpOnce:
		if h.Req == 0 || h.Req > MaxMessage || h.Resp > MaxMessage {
			return Header{}, fmt.Errorf("%w: sizes %d/%d outside 1..%d", ErrBadHeader, h.Req, h.Resp, MaxMessage)
		}
	default:
		return Header{}, fmt.Errorf("%w: op %q", ErrBadHeader, b[4])
	}
	return h, nil
}
