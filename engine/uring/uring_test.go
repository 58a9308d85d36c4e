package uring

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRing returns a ring or skips the test where the kernel refuses
// io_uring.
func newRing(t *testing.T, cfg Config) *Ring {
	t.Helper()
	r, err := New(cfg)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		t.Skipf("io_uring refused here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// submitAndReap submits and waits for want completions.
func submitAndReap(t *testing.T, r *Ring, want int) []CQE {
	t.Helper()
	var got []CQE
	buf := make([]CQE, 64)
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want {
		if _, err := r.SubmitAndWait(1, time.Second); err != nil {
			t.Fatal(err)
		}
		n := r.Reap(buf)
		got = append(got, buf[:n]...)
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d completions: %+v", len(got), want, got)
		}
	}
	return got
}

func socketpair(t *testing.T, flags int) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|flags, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func TestProbeKnowsTheEngineOps(t *testing.T) {
	r := newRing(t, Config{Entries: 8})
	p, err := r.Probe()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []uint8{OpNop, OpPollAdd, OpAccept, OpAsyncCancel, OpClose, OpRead, OpSend, OpRecv, OpSplice, OpTimeout, OpShutdown} {
		if !p.Supported(op) {
			t.Errorf("probe: op %d unsupported", op)
		}
	}
	if p.Supported(255) {
		t.Error("probe claims op 255")
	}
	if r.Features()&FeatSingleMmap == 0 || r.Features()&FeatExtArg == 0 {
		t.Logf("features %#x", r.Features())
	}
}

// TestRingWrapsAround pushes far more entries than the rings hold, in
// uneven batches, and checks every completion arrives exactly once: the
// head/tail protocol and masks are right.
func TestRingWrapsAround(t *testing.T) {
	r := newRing(t, Config{Entries: 8, CQEntries: 16})
	const total = 1000
	seen := make([]bool, total)
	next, done := 0, 0
	buf := make([]CQE, 5)
	for done < total {
		for batch := 0; next < total && batch < 1+next%7; batch++ {
			sqe := r.GetSQE()
			if sqe == nil {
				break
			}
			sqe.PrepNop(uint64(next))
			next++
		}
		if _, err := r.SubmitAndWait(1, -1); err != nil {
			t.Fatal(err)
		}
		for {
			n := r.Reap(buf)
			if n == 0 {
				break
			}
			for _, c := range buf[:n] {
				if c.Res != 0 || seen[c.UserData] {
					t.Fatalf("bad completion %+v", c)
				}
				seen[c.UserData] = true
				done++
			}
		}
	}
	if r.Pending() != 0 || r.Ready() != 0 {
		t.Fatalf("pending %d ready %d", r.Pending(), r.Ready())
	}
}

func TestGetSQEFull(t *testing.T) {
	r := newRing(t, Config{Entries: 4})
	for i := range 4 {
		if r.GetSQE() == nil {
			t.Fatalf("queue full after %d entries", i)
		}
	}
	if r.GetSQE() != nil {
		t.Fatal("GetSQE returned a fifth entry of a 4-entry queue")
	}
	for i := range 4 {
		r.sqes[i].PrepNop(uint64(i))
	}
	submitAndReap(t, r, 4)
	if r.GetSQE() == nil {
		t.Fatal("no entry after the kernel consumed the queue")
	}
}

func TestPollMultishot(t *testing.T) {
	r := newRing(t, Config{})
	a, b := socketpair(t, unix.SOCK_NONBLOCK)
	r.GetSQE().PrepPollAdd(a, unix.POLLIN, true, 7)
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		unix.Write(b, []byte("x"))
		c := submitAndReap(t, r, 1)[0]
		if c.UserData != 7 || c.Res&unix.POLLIN == 0 || !c.More() {
			t.Fatalf("wake-up %d: %+v, want POLLIN with more to come", i, c)
		}
		unix.Read(a, make([]byte, 8))
	}
	// Cancel it: the poll ends with -ECANCELED, the cancel with 0.
	r.GetSQE().PrepCancel(7, 0, 8)
	got := submitAndReap(t, r, 2)
	for _, c := range got {
		switch c.UserData {
		case 7:
			if c.Res != -int32(unix.ECANCELED) || c.More() {
				t.Fatalf("cancelled poll: %+v", c)
			}
		case 8:
			if c.Res != 0 {
				t.Fatalf("cancel: %+v", c)
			}
		}
	}
}

func TestAcceptMultishot(t *testing.T) {
	r := newRing(t, Config{})
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r.GetSQE().PrepAccept(int(f.Fd()), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, true, 1)
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		got := submitAndReap(t, r, 1)[0]
		if got.Res < 0 || !got.More() {
			t.Fatalf("accept %d: %+v", i, got)
		}
		c.Write([]byte("hi"))
		buf := make([]byte, 2)
		for {
			n, err := unix.Read(int(got.Res), buf)
			if err == unix.EAGAIN {
				continue
			}
			if n != 2 || string(buf) != "hi" {
				t.Fatalf("accepted socket read %q, %v", buf[:max(n, 0)], err)
			}
			break
		}
		unix.Close(int(got.Res))
		c.Close()
	}
	r.GetSQE().PrepCancel(1, 0, 2)
	submitAndReap(t, r, 2)
}

func TestRecvSendCloseShutdown(t *testing.T) {
	r := newRing(t, Config{})
	a, b := socketpair(t, 0)
	msg := []byte("through the ring")
	r.GetSQE().PrepSend(a, msg, 0, 1)
	if c := submitAndReap(t, r, 1)[0]; c.Res != int32(len(msg)) {
		t.Fatalf("send: %+v", c)
	}
	buf := make([]byte, 64)
	r.GetSQE().PrepRecv(b, buf, 0, 2)
	if c := submitAndReap(t, r, 1)[0]; c.Res != int32(len(msg)) || !bytes.Equal(buf[:c.Res], msg) {
		t.Fatalf("recv: %+v %q", c, buf)
	}
	r.GetSQE().PrepShutdown(a, unix.SHUT_WR, 3)
	if c := submitAndReap(t, r, 1)[0]; c.Res != 0 {
		t.Fatalf("shutdown: %+v", c)
	}
	r.GetSQE().PrepRecv(b, buf, 0, 4)
	if c := submitAndReap(t, r, 1)[0]; c.Res != 0 {
		t.Fatalf("recv after shutdown: %+v, want EOF", c)
	}
	dup, _ := unix.Dup(a)
	r.GetSQE().PrepClose(dup, 5)
	if c := submitAndReap(t, r, 1)[0]; c.Res != 0 {
		t.Fatalf("close: %+v", c)
	}
	if _, err := unix.FcntlInt(uintptr(dup), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("descriptor still open after close: %v", err)
	}
}

func TestRecvProvidedBuffers(t *testing.T) {
	r := newRing(t, Config{})
	br, err := r.RegisterBufRing(3, 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	a, b := socketpair(t, 0)
	r.GetSQE().PrepRecvBufferSelect(b, br.Group(), true, 9)
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 { // more rounds than buffers: recycling works
		msg := []byte{'m', byte('0' + i)}
		unix.Write(a, msg)
		c := submitAndReap(t, r, 1)[0]
		if c.Res != 2 || c.Flags&CQEFBuffer == 0 {
			t.Fatalf("round %d: %+v", i, c)
		}
		id := uint16(c.Flags >> CQEBufferShift)
		if got := br.Buffer(id)[:c.Res]; !bytes.Equal(got, msg) {
			t.Fatalf("round %d: buffer %d holds %q", i, id, got)
		}
		br.Recycle(id)
		if !c.More() {
			// The kernel may end a multishot recv; arm it again.
			r.GetSQE().PrepRecvBufferSelect(b, br.Group(), true, 9)
		}
	}
	r.GetSQE().PrepCancel(9, 0, 10)
	submitAndReap(t, r, 2)
}

func TestSpliceAfterPoll(t *testing.T) {
	r := newRing(t, Config{})
	ln, _ := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer ln.Close()
	c, _ := net.Dial("tcp", ln.Addr().String())
	defer c.Close()
	s, _ := ln.AcceptTCP()
	f, _ := s.File() // a blocking duplicate is fine for io-wq
	defer f.Close()
	s.Close()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	fd := int(f.Fd())
	// Poll first so no io-wq worker waits for the data.
	r.GetSQE().PrepPollAdd(fd, unix.POLLIN, false, 1)
	r.Submit()
	c.Write([]byte("spliced"))
	if got := submitAndReap(t, r, 1)[0]; got.Res&unix.POLLIN == 0 {
		t.Fatalf("poll: %+v", got)
	}
	sqe := r.GetSQE()
	sqe.PrepSplice(fd, p[1], 1<<16, unix.SPLICE_F_NONBLOCK, 2)
	sqe.Flags |= SQEIOHardlink
	r.GetSQE().PrepSplice(p[0], fd, 1<<16, unix.SPLICE_F_NONBLOCK, 3)
	got := submitAndReap(t, r, 2)
	if got[0].UserData != 2 || got[0].Res != 7 || got[1].UserData != 3 || got[1].Res != 7 {
		t.Fatalf("splices: %+v", got)
	}
	// The bytes went back out to the client.
	buf := make([]byte, 7)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "spliced" {
		t.Fatalf("client read %q, %v", buf, err)
	}
}

func TestTimeoutAndWaitTimeout(t *testing.T) {
	r := newRing(t, Config{})
	ts := unix.NsecToTimespec(int64(time.Millisecond))
	r.GetSQE().PrepTimeout(&ts, 0, 0, 1)
	if c := submitAndReap(t, r, 1)[0]; c.Res != -int32(unix.ETIME) {
		t.Fatalf("timeout: %+v", c)
	}
	runtime.KeepAlive(&ts)
	// Waiting with nothing in flight returns at the timeout, no error.
	if _, err := r.SubmitAndWait(1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r.Ready() != 0 {
		t.Fatal("completions out of nowhere")
	}
}

// TestEventfdWake is the engine's wake-up: a read armed on an eventfd
// completes when another goroutine writes it.
func TestEventfdWake(t *testing.T) {
	r := newRing(t, Config{})
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC) // blocking: the ring arms its poll
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	buf := make([]byte, 8)
	r.GetSQE().PrepRead(efd, buf, 1)
	r.Submit()
	go func() { unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}) }()
	if c := submitAndReap(t, r, 1)[0]; c.Res != 8 || buf[0] != 1 {
		t.Fatalf("eventfd read: %+v %v", c, buf)
	}
}

func TestRegisterEventfd(t *testing.T) {
	r := newRing(t, Config{})
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	defer unix.Close(efd)
	if err := r.RegisterEventfd(efd); err != nil {
		t.Fatal(err)
	}
	r.GetSQE().PrepNop(1)
	submitAndReap(t, r, 1)
	buf := make([]byte, 8)
	if _, err := unix.Read(efd, buf); err != nil {
		t.Fatalf("eventfd not signalled: %v", err)
	}
	if err := r.UnregisterEventfd(); err != nil {
		t.Fatal(err)
	}
}

// TestSingleIssuerDeferTaskrun sets the ring up as the engine does: created
// disabled, enabled on the locked thread that will submit.
func TestSingleIssuerDeferTaskrun(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRing(t, Config{Flags: SetupSingleIssuer | SetupDeferTaskrun | SetupRDisabled})
	if err := r.Enable(); err != nil {
		t.Fatal(err)
	}
	a, b := socketpair(t, unix.SOCK_NONBLOCK)
	r.GetSQE().PrepPollAdd(a, unix.POLLIN, true, 1)
	r.Submit()
	unix.Write(b, []byte("x"))
	if c := submitAndReap(t, r, 1)[0]; c.UserData != 1 || c.Res&unix.POLLIN == 0 {
		t.Fatalf("poll: %+v", c)
	}
}

func BenchmarkNop(b *testing.B) {
	r, err := New(Config{})
	if err != nil {
		b.Skipf("io_uring refused: %v", err)
	}
	defer r.Close()
	cqes := make([]CQE, 64)
	b.ReportAllocs()
	for b.Loop() {
		r.GetSQE().PrepNop(1)
		r.SubmitAndWait(1, -1)
		r.Reap(cqes)
	}
}
