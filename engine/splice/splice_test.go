package splice

import (
	"bytes"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// tcpPair returns a connected loopback TCP pair: a raw non-blocking fd
// owned by the test, and the peer as a net.Conn.
func tcpPair(t *testing.T) (int, net.Conn) {
	t.Helper()
	c, s := nettest.TCPPair(t)
	return nettest.DetachFD(t, c), s
}

func TestPipeSize(t *testing.T) {
	for _, size := range []int{0, 4096, 256 << 10} {
		p, err := NewPipe(size)
		if err != nil {
			t.Fatal(err)
		}
		want := size
		if want == 0 {
			want = DefaultPipeSize
		}
		if p.Size != want {
			t.Errorf("NewPipe(%d).Size = %d", size, p.Size)
		}
		p.Close()
	}
}

func TestSpliceThroughPipe(t *testing.T) {
	src, srcPeer := tcpPair(t)
	dst, dstPeer := tcpPair(t)
	pool := NewPool(PoolConfig{PipeSize: 64 << 10})
	defer pool.Close()
	p, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.In(src, 1<<20); err != unix.EAGAIN {
		t.Fatalf("In on an empty socket = %v, want EAGAIN", err)
	}
	msg := bytes.Repeat([]byte("splice!"), 1000)
	srcPeer.Write(msg)
	srcPeer.(*net.TCPConn).CloseWrite()
	got := 0
	for got < len(msg) {
		n, err := p.In(src, 1<<20)
		if err == unix.EAGAIN {
			continue // the loopback segment is still on its way
		}
		if err != nil || n == 0 {
			t.Fatalf("In = %d, %v", n, err)
		}
		got += n
	}
	if p.Buffered != len(msg) {
		t.Fatalf("Buffered = %d", p.Buffered)
	}
	for p.Buffered > 0 {
		if _, err := p.Out(dst); err != nil {
			t.Fatal(err)
		}
	}
	// End of stream reads as (0, nil).
	for {
		n, err := p.In(src, 1<<20)
		if err == unix.EAGAIN {
			continue
		}
		if n != 0 || err != nil {
			t.Fatalf("In at EOF = %d, %v", n, err)
		}
		break
	}
	unix.Shutdown(dst, unix.SHUT_WR)
	out, err := io.ReadAll(dstPeer)
	if err != nil || !bytes.Equal(out, msg) {
		t.Fatalf("peer read %d bytes, %v", len(out), err)
	}
	pool.Put(p)
	if pool.InUse() != 0 || pool.Free() != 1 {
		t.Fatalf("pool in use %d free %d", pool.InUse(), pool.Free())
	}
	if q, _ := pool.Get(); q != p {
		t.Fatal("an empty pipe was not reused")
	} else {
		pool.Put(q)
	}
}

func TestPoolClosesDirtyAndExcessPipes(t *testing.T) {
	pool := NewPool(PoolConfig{PipeSize: 4096, MaxFree: 1})
	defer pool.Close()
	a, _ := pool.Get()
	b, _ := pool.Get()
	c, _ := pool.Get()
	unix.Write(c.W, []byte("stale"))
	c.Buffered = 5
	pool.Put(c) // holds data: closed
	pool.Put(a) // kept
	pool.Put(b) // over MaxFree: closed
	if pool.Free() != 1 || pool.InUse() != 0 {
		t.Fatalf("free %d in use %d", pool.Free(), pool.InUse())
	}
	if _, err := unix.FcntlInt(uintptr(c.R), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("dirty pipe still open: %v", err)
	}
}

func TestParkThenOut(t *testing.T) {
	tests := []struct {
		name    string
		pipe    int   // requested pipe size
		parks   []int // sizes parked one after another
		wantErr []bool
	}{
		{"one byte", 4096, []int{1}, []bool{false}},
		{"fills the pipe", 4096, []int{4000, 96}, []bool{false, false}},
		{"more than the room", 4096, []int{4000, 97}, []bool{false, true}},
		{"larger than the pipe", 4096, []int{5000}, []bool{true}},
		{"behind earlier bytes", 64 << 10, []int{100, 16 << 10, 3}, []bool{false, false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst, dstPeer := tcpPair(t)
			p, err := NewPipe(tc.pipe)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var want []byte
			for i, n := range tc.parks {
				b := bytes.Repeat([]byte{byte('a' + i)}, n)
				err := p.Park(b)
				if (err != nil) != tc.wantErr[i] {
					t.Fatalf("Park(%d bytes) #%d = %v, want error %v", n, i, err, tc.wantErr[i])
				}
				if err == nil {
					want = append(want, b...)
				}
			}
			if p.Buffered != len(want) {
				t.Fatalf("Buffered = %d, want %d", p.Buffered, len(want))
			}
			for p.Buffered > 0 {
				if _, err := p.Out(dst); err != nil {
					t.Fatal(err)
				}
			}
			unix.Shutdown(dst, unix.SHUT_WR)
			got, err := io.ReadAll(dstPeer)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("peer read %d bytes (%v), want the %d parked", len(got), err, len(want))
			}
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
