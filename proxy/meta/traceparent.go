package meta

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
)

// ErrTraceParent is wrapped by every traceparent parse error.
var ErrTraceParent = errors.New("meta: invalid traceparent header")

// TraceParent is a W3C trace context traceparent value (version 00).
type TraceParent struct {
	TraceID  [16]byte
	ParentID [8]byte
	Flags    byte
}

// traceParentLen is the length of a version 00 value.
const traceParentLen = 2 + 1 + 32 + 1 + 16 + 1 + 2

// NewTraceParent returns a traceparent with random non-zero ids and no
// flags, as ztunnel sends on each CONNECT. The ids correlate logs; they are
// not secrets, so the fast generator is enough.
func NewTraceParent() TraceParent {
	var t TraceParent
	for t.TraceID == ([16]byte{}) {
		putUint64(t.TraceID[:8], rand.Uint64())
		putUint64(t.TraceID[8:], rand.Uint64())
	}
	for t.ParentID == ([8]byte{}) {
		putUint64(t.ParentID[:], rand.Uint64())
	}
	return t
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}

// String formats the version 00 value: 00-<trace id>-<parent id>-<flags>.
func (t TraceParent) String() string {
	b := make([]byte, 0, traceParentLen)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, t.TraceID[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, t.ParentID[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, []byte{t.Flags})
	return string(b)
}

// ParseTraceParent parses a traceparent value. Version ff and all-zero ids
// are invalid; a higher version is read by its version 00 prefix when what
// follows starts with '-', as the specification asks.
func ParseTraceParent(s string) (TraceParent, error) {
	var t TraceParent
	if len(s) < traceParentLen {
		return t, fmt.Errorf("%w: %d bytes", ErrTraceParent, len(s))
	}
	ver, ok := lowerHex(s[0:2])
	if !ok || ver[0] == 0xff {
		return t, fmt.Errorf("%w: version %q", ErrTraceParent, s[0:2])
	}
	if ver[0] == 0 && len(s) != traceParentLen {
		return t, fmt.Errorf("%w: version 00 with %d bytes", ErrTraceParent, len(s))
	}
	if len(s) > traceParentLen && s[traceParentLen] != '-' {
		return t, fmt.Errorf("%w: no '-' after the flags", ErrTraceParent)
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return t, fmt.Errorf("%w: separators", ErrTraceParent)
	}
	tid, ok1 := lowerHex(s[3:35])
	pid, ok2 := lowerHex(s[36:52])
	flags, ok3 := lowerHex(s[53:55])
	if !ok1 || !ok2 || !ok3 {
		return t, fmt.Errorf("%w: not lower-case hex", ErrTraceParent)
	}
	copy(t.TraceID[:], tid)
	copy(t.ParentID[:], pid)
	t.Flags = flags[0]
	if t.TraceID == ([16]byte{}) || t.ParentID == ([8]byte{}) {
		return TraceParent{}, fmt.Errorf("%w: all-zero id", ErrTraceParent)
	}
	return t, nil
}

// lowerHex decodes s, which must be lower-case hex digits only.
func lowerHex(s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return nil, false
		}
	}
	b, err := hex.DecodeString(s)
	return b, err == nil
}
