package hbone

import (
	"net"
	"sync"
)

// Batcher is implemented by a transport connection that can gather several
// writes into one. crypto/tls writes every record (at most 16 KiB) to its
// underlying connection separately; if the connection given to hbone — or
// the one its NetConn method returns, as for a *tls.Conn — is a Batcher,
// the connection's writer brackets each flush with BeginBatch and EndBatch,
// so a batch of frames leaves in one syscall however many records it
// spans. NewBatchConn makes one.
type Batcher interface {
	// BeginBatch makes writes accumulate until EndBatch.
	BeginBatch()
	// EndBatch writes what accumulated since BeginBatch in one Write.
	EndBatch() error
}

// batchBufs holds the gather buffers of batch connections between batches,
// so an idle connection pins none.
var batchBufs = sync.Pool{New: func() any { return &frameBuf{b: make([]byte, 0, writeBufCap+8<<10)} }}

// batchConn is a Batcher around a raw connection.
type batchConn struct {
	net.Conn

	mu       sync.Mutex // guards the following fields and orders writes
	batching bool
	buf      *frameBuf
}

// NewBatchConn wraps a raw (TCP) connection so that a TLS connection built
// on it writes each hbone batch with one syscall. Use it under crypto/tls:
// tls.Client(hbone.NewBatchConn(tcpConn), cfg). Writes outside a batch (the
// handshake, alerts) pass straight through.
func NewBatchConn(nc net.Conn) net.Conn {
	return &batchConn{Conn: nc}
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.batching {
		return c.Conn.Write(p)
	}
	if c.buf == nil {
		c.buf = batchBufs.Get().(*frameBuf)
	}
	c.buf.b = append(c.buf.b, p...)
	return len(p), nil
}

func (c *batchConn) BeginBatch() {
	c.mu.Lock()
	c.batching = true
	c.mu.Unlock()
}

func (c *batchConn) EndBatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batching = false
	if c.buf == nil {
		return nil
	}
	_, err := c.Conn.Write(c.buf.b)
	putBatchBuf(c.buf)
	c.buf = nil
	return err
}

func putBatchBuf(f *frameBuf) {
	if cap(f.b) > 4*writeBufCap {
		return
	}
	f.b = f.b[:0]
	batchBufs.Put(f)
}

// NetConn returns the wrapped connection.
func (c *batchConn) NetConn() net.Conn { return c.Conn }

// batcherOf finds the Batcher under nc, if any.
func batcherOf(nc net.Conn) Batcher {
	if b, ok := nc.(Batcher); ok {
		return b
	}
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		if b, ok := u.NetConn().(Batcher); ok {
			return b
		}
	}
	return nil
}
