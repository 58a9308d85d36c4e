package engine

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/ztunnel-go/ztunnel/engine/splice"
	"golang.org/x/sys/unix"
)

func TestDrainedOnlyWhenTheReadCannotHaveStoppedOnThePipe(t *testing.T) {
	p := &splice.Pipe{Size: 1 << 20}
	slots := p.Slots()
	tests := []struct {
		name      string
		before, n int
		want      bool
	}{
		{"one byte into an empty pipe", 0, 1, true},
		{"short read below the slot count", 0, slots - 1, true},
		{"as many bytes as slots: the slots may be full", 0, slots, false},
		{"bulk read", 0, 512 << 10, false},
		{"filled the pipe's room", 0, p.Size, false},
		{"short read on top of buffered bytes", 10, 10, true},
		{"buffered bytes and the read reach the slot count", slots - 10, 10, false},
		{"filled the room left by buffered bytes", p.Size - 100, 100, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := drained(p, tc.before, tc.n); got != tc.want {
				t.Errorf("drained(before %d, n %d) = %v, want %v (pipe %d bytes, %d slots)", tc.before, tc.n, got, tc.want, p.Size, slots)
			}
		})
	}
}

// Segments queued before the handover, and data that shares its last
// segment with the FIN, are read to the end although the loop skips the
// EAGAIN probe after short reads: a socket that may still hold bytes is
// read again.
func TestRelayShortReadsMissNothing(t *testing.T) {
	tests := []struct {
		name     string
		segments int  // 1-byte writes queued before the handover
		fin      bool // the client closes its write side right after
	}{
		{"one tiny segment", 1, false},
		{"more tiny segments than a pipe has slots", 600, false},
		{"tiny segments then FIN", 300, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Config{Backend: BackendEpoll})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			client, a := loopbackPair(t)
			b, server := loopbackPair(t)
			want := bytes.Repeat([]byte{'x'}, tc.segments)
			for i := range tc.segments {
				if _, err := client.Write(want[i : i+1]); err != nil {
					t.Fatal(err)
				}
			}
			if tc.fin {
				client.CloseWrite()
			}
			// Wait (without time) until every byte sits in a's queue, so
			// the relay's first read sees them all at once.
			for queued(t, a) < tc.segments {
				runtime.Gosched()
			}
			done := make(chan Result, 1)
			e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { done <- r })
			got := make([]byte, tc.segments)
			if _, err := io.ReadFull(server, got); err != nil {
				t.Fatalf("server read %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("server got other bytes")
			}
			if tc.fin {
				if n, err := server.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					t.Fatalf("after the data: %d, %v; want EOF", n, err)
				}
			}
			server.Write([]byte("y"))
			if _, err := io.ReadFull(client, make([]byte, 1)); err != nil {
				t.Fatalf("reply: %v", err)
			}
			client.Close()
			server.Close()
			<-done
		})
	}
}

// queued reports the bytes in c's receive queue (SIOCINQ).
func queued(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatal(err, ierr)
	}
	return n
}

// TestBlockStreamLoops: Config.BlockStreamLoops makes the stream loops
// wait as the TCP⇄TCP loops do (blocked in epoll_wait); without it they
// park in the runtime's netpoller.
func TestBlockStreamLoops(t *testing.T) {
	for _, block := range []bool{false, true} {
		e, err := New(Config{Backend: BackendEpoll, Loops: 2, BlockStreamLoops: block})
		if err != nil {
			t.Fatal(err)
		}
		b := e.backend.(*epollBackend)
		for _, l := range b.tcp {
			if !l.blocking {
				t.Errorf("BlockStreamLoops=%v: a TCP⇄TCP loop parks", block)
			}
		}
		for _, l := range b.strm {
			if l.blocking != block {
				t.Errorf("BlockStreamLoops=%v: a stream loop has blocking=%v", block, l.blocking)
			}
		}
		e.Close()
	}
}
