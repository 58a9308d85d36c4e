package tlsinterop

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// tap relays one TCP connection record by record and keeps the largest
// application_data TLSCiphertext length seen each way, so that a test can
// check the records that crossed as the wire has them.
type tap struct {
	ln     *net.TCPListener
	target string
	wg     sync.WaitGroup

	mu  sync.Mutex // guards max
	max [2]int     // [0]: from the dialer, [1]: towards it
}

// newTap listens for one connection and relays it to target.
func newTap(t *testing.T, target string) *tap {
	t.Helper()
	tp := &tap{ln: nettest.Listen(t), target: target}
	tp.wg.Go(func() {
		_ = tp.ln.SetDeadline(time.Now().Add(peerTimeout))
		in, err := tp.ln.AcceptTCP()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := dialTCP(target)
		if err != nil {
			return
		}
		defer out.Close()
		var both sync.WaitGroup
		both.Go(func() { tp.relay(0, out, in) })
		both.Go(func() { tp.relay(1, in, out) })
		both.Wait()
	})
	t.Cleanup(func() {
		tp.ln.Close()
		tp.wg.Wait()
	})
	return tp
}

func (tp *tap) addr() string { return tp.ln.Addr().String() }

// largest returns the largest application_data records seen: from the
// dialer and towards it.
func (tp *tap) largest() (from, to int) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.max[0], tp.max[1]
}

// relay copies src to dst one record at a time, then half-closes dst.
func (tp *tap) relay(dir int, dst, src *net.TCPConn) {
	defer dst.CloseWrite()
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			return
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if hdr[0] == 23 {
			tp.mu.Lock()
			tp.max[dir] = max(tp.max[dir], n)
			tp.mu.Unlock()
		}
		if _, err := dst.Write(hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(dst, src, int64(n)); err != nil {
			return
		}
	}
}

// dialTCP connects to a loopback address.
func dialTCP(addr string) (*net.TCPConn, error) {
	c, err := net.DialTimeout("tcp", addr, peerTimeout)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}
