// Package bufpool hands out byte buffers in power-of-two size classes, so the
// data path reuses memory instead of allocating per connection.
//
// Buffers travel as *[]byte so that Put does not allocate. A buffer has one
// owner at a time: whoever Gets it either Puts it back or hands it off, and
// must not touch it afterwards.
//
// Imports (of ours): nothing of ours (only the standard library). Imported by:
// engine.
package bufpool

import (
	"math/bits"
	"sync"
)

const (
	// MinSize is the smallest class; smaller requests round up to it.
	MinSize = 1 << minShift
	// MaxSize is the largest pooled class; larger requests are allocated and
	// dropped on Put.
	MaxSize = 1 << maxShift
	// DefaultSize is the relay buffer size when a flow has no better hint.
	DefaultSize = 32 << 10

	minShift = 10 // 1 KiB
	maxShift = 20 // 1 MiB
)

var pools [maxShift - minShift + 1]sync.Pool

func class(size int) int {
	if size <= MinSize {
		return 0
	}
	return bits.Len(uint(size-1)) - minShift
}

// Get returns a buffer of exactly size bytes (its capacity is the class size).
func Get(size int) *[]byte {
	if size > MaxSize {
		b := make([]byte, size)
		return &b
	}
	c := class(size)
	if v := pools[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<(c+minShift))
	return &b
}

// Put returns b to its class. Buffers whose capacity is not a class size
// (for example oversized ones) are dropped.
func Put(b *[]byte) {
	if b == nil {
		return
	}
	c := cap(*b)
	if c < MinSize || c > MaxSize || c&(c-1) != 0 {
		return
	}
	*b = (*b)[:c]
	pools[class(c)].Put(b)
}
