package hbone

import "sync"

// Received DATA lives in chains of pooled chunks, so a stream's memory follows
// what is actually buffered (bounded by its receive window) and an idle stream
// holds nothing. Two size classes keep small request/response traffic from
// pinning large chunks.
const (
	smallChunkSize = 4 << 10
	largeChunkSize = 64 << 10
)

type chunk struct {
	buf  []byte // fixed length: the chunk's size class
	r, w int    // unread data is buf[r:w]
}

var (
	smallChunks = sync.Pool{New: func() any { return &chunk{buf: make([]byte, smallChunkSize)} }}
	largeChunks = sync.Pool{New: func() any { return &chunk{buf: make([]byte, largeChunkSize)} }}
)

func getChunk(want int) *chunk {
	if want <= smallChunkSize {
		return smallChunks.Get().(*chunk)
	}
	return largeChunks.Get().(*chunk)
}

func putChunk(c *chunk) {
	c.r, c.w = 0, 0
	if len(c.buf) == smallChunkSize {
		smallChunks.Put(c)
	} else {
		largeChunks.Put(c)
	}
}

// recvBuffer is a FIFO of received bytes. The connection's read path fills
// its tail (the goroutine driver's reader possibly outside the stream lock,
// see Stream.filling); the stream's reader drains its head.
type recvBuffer struct {
	chunks []*chunk // chunks[head:] are live
	head   int
	size   int // committed, unread bytes
}

// reserve returns space for up to n more bytes at the tail.
func (b *recvBuffer) reserve(n int) []byte {
	if len(b.chunks) > b.head {
		t := b.chunks[len(b.chunks)-1]
		if t.w < len(t.buf) {
			return t.buf[t.w:min(len(t.buf), t.w+n)]
		}
	}
	if b.head > 0 && b.head == len(b.chunks) {
		b.chunks, b.head = b.chunks[:0], 0
	}
	c := getChunk(n)
	b.chunks = append(b.chunks, c)
	return c.buf[:min(len(c.buf), n)]
}

// commit makes n bytes written into the last reserved space readable.
func (b *recvBuffer) commit(n int) {
	b.chunks[len(b.chunks)-1].w += n
	b.size += n
}

// read copies buffered bytes into p and returns fully read chunks to their
// pool; the tail is kept while filling, as the filler still writes into it.
func (b *recvBuffer) read(p []byte, filling bool) int {
	n := 0
	for n < len(p) && b.size > 0 {
		c := b.chunks[b.head]
		k := copy(p[n:], c.buf[c.r:c.w])
		c.r += k
		n += k
		b.size -= k
		if c.r == c.w && (c.w == len(c.buf) || b.head < len(b.chunks)-1) {
			b.popHead()
		}
	}
	if b.size == 0 && !filling {
		b.free()
	}
	return n
}

// peek appends views of the unread bytes, chunk by chunk, to views, at
// most cap(views) of them. The filler writes only beyond the tail's w, so
// the views stay valid until advance.
func (b *recvBuffer) peek(views [][]byte) [][]byte {
	for _, c := range b.chunks[b.head:] {
		if len(views) == cap(views) {
			break
		}
		if c.w > c.r {
			views = append(views, c.buf[c.r:c.w])
		}
	}
	return views
}

// advance drops the first n bytes of what peek returned, as read would.
func (b *recvBuffer) advance(n int, filling bool) {
	for n > 0 && b.size > 0 {
		c := b.chunks[b.head]
		k := min(n, c.w-c.r)
		c.r += k
		b.size -= k
		n -= k
		if c.r == c.w && (c.w == len(c.buf) || b.head < len(b.chunks)-1) {
			b.popHead()
		}
	}
	if b.size == 0 && !filling {
		b.free()
	}
}

func (b *recvBuffer) popHead() {
	putChunk(b.chunks[b.head])
	b.chunks[b.head] = nil
	b.head++
	if b.head == len(b.chunks) {
		b.chunks, b.head = b.chunks[:0], 0
	}
}

// discard drops all unread bytes and returns how many there were. Chunks are
// released unless filling, in which case the filler releases them.
func (b *recvBuffer) discard(filling bool) int {
	n := b.size
	b.size = 0
	for _, c := range b.chunks[b.head:] {
		c.r = c.w
	}
	if !filling {
		b.free()
	}
	return n
}

// free returns every chunk to its pool.
func (b *recvBuffer) free() {
	for i := b.head; i < len(b.chunks); i++ {
		putChunk(b.chunks[i])
		b.chunks[i] = nil
	}
	b.chunks, b.head, b.size = b.chunks[:0], 0, 0
}

// frameBuf is a write buffer; pooled by pointer so Put does not allocate.
type frameBuf struct {
	b []byte
}

// writeBufSize is the soft limit of bytes queued for the writer: streams
// stop appending DATA beyond it, control frames do not. The writer flushes
// the whole buffer with one Write while the next one fills (256 KiB: one
// syscall per 256 KiB, measured 7% less CPU per byte than 64 KiB on two
// hops). writeBufCap leaves room to finish a frame rather than split it.
const (
	writeBufSize = 256 << 10
	writeBufCap  = writeBufSize + 4<<10
)

var frameBufs = sync.Pool{New: func() any { return &frameBuf{b: make([]byte, 0, writeBufCap)} }}

func getFrameBuf() *frameBuf { return frameBufs.Get().(*frameBuf) }

func putFrameBuf(f *frameBuf) {
	if cap(f.b) > 4*writeBufSize {
		return // grown by a burst of control frames; let it go
	}
	f.b = f.b[:0]
	frameBufs.Put(f)
}
