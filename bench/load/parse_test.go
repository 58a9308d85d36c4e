package load

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Op: OpEcho}, {Op: OpSink}, {Op: OpRR, Req: 1, Resp: 1}, {Op: OpOnce, Req: 1024, Resp: MaxMessage},
	} {
		b := h.Marshal()
		got, err := ParseHeader(b[:])
		if err != nil || got != h {
			t.Errorf("ParseHeader(Marshal(%+v)) = %+v, %v", h, got, err)
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	good := Header{Op: OpRR, Req: 1, Resp: 1}.Marshal()
	mutate := func(f func(b []byte)) []byte {
		b := good
		f(b[:])
		return b[:]
	}
	for name, b := range map[string][]byte{
		"short":           good[:HeaderLen-1],
		"magic":           mutate(func(b []byte) { b[0] = 'x' }),
		"reserved":        mutate(func(b []byte) { b[6] = 1 }),
		"op":              mutate(func(b []byte) { b[4] = 'Z' }),
		"zero request":    mutate(func(b []byte) { copy(b[8:12], []byte{0, 0, 0, 0}) }),
		"huge request":    mutate(func(b []byte) { copy(b[8:12], []byte{0xff, 0, 0, 0}) }),
		"huge response":   mutate(func(b []byte) { copy(b[12:16], []byte{0xff, 0, 0, 0}) }),
		"sink with sizes": mutate(func(b []byte) { b[4] = byte(OpSink) }),
		"echo with sizes": mutate(func(b []byte) { b[4], b[11] = byte(OpEcho), 0 }),
	} {
		if _, err := ParseHeader(b); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: %v, want ErrBadHeader", name, err)
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, h := range []Header{{Op: OpSink}, {Op: OpRR, Req: 1, Resp: 1}} {
		b := h.Marshal()
		fuzzseed.Add(f, b[:])
	}
	fuzzseed.Add(f, []byte("zld1E\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		if h.Req > MaxMessage || h.Resp > MaxMessage {
			t.Fatalf("accepted sizes %d/%d", h.Req, h.Resp)
		}
		m := h.Marshal()
		if !bytes.Equal(m[:], b[:HeaderLen]) {
			t.Fatalf("accepted %x, re-encodes as %x", b[:HeaderLen], m)
		}
	})
}

func TestParseProc(t *testing.T) {
	status := []byte("Name:\tztunnel\nState:\tS (sleeping)\nVmRSS:\t   12345 kB\nThreads:\t7\n")
	rss, threads, err := ParseStatus(status)
	if err != nil || rss != 12345 || threads != 7 {
		t.Fatalf("ParseStatus = %d, %d, %v", rss, threads, err)
	}
	if _, _, err := ParseStatus([]byte("Name:\tx\nState:\tZ (zombie)\n")); err == nil {
		t.Fatal("a status without VmRSS parsed")
	}
	// A command name with spaces and a parenthesis.
	stat := []byte("42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 7 0 1000 2000000 300 18446744073709551615")
	ticks, err := ParseStatCPU(stat)
	if err != nil || ticks != 380 {
		t.Fatalf("ParseStatCPU = %d, %v, want 380", ticks, err)
	}
	if _, err := ParseStatCPU([]byte("42 (x) S 1")); err == nil {
		t.Fatal("a short stat parsed")
	}
}

func TestReadProcSelf(t *testing.T) {
	ps, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ps.RSSKiB <= 0 || ps.FDs <= 0 || ps.Threads <= 0 {
		t.Fatalf("ReadProc(self) = %+v", ps)
	}
}

func TestParseGoroutineCount(t *testing.T) {
	n, err := ParseGoroutineCount([]byte("goroutine profile: total 17\n5 @ 0x1 0x2\n"))
	if err != nil || n != 17 {
		t.Fatalf("= %d, %v", n, err)
	}
	for _, bad := range []string{"", "heap profile: 1", "goroutine profile: total -3", "goroutine profile: total x"} {
		if _, err := ParseGoroutineCount([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseGoroutineCount(f *testing.F) {
	fuzzseed.Add(f, []byte("goroutine profile: total 17\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := ParseGoroutineCount(b); err == nil && n < 0 {
			t.Fatalf("negative count %d", n)
		}
	})
}
