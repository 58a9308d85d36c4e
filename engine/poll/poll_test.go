package poll

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T) *Poller {
	t.Helper()
	p, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func socketpair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// waitFunc is Wait or WaitPark; every test runs with both.
type waitFunc func(p *Poller, events []Event, timeout time.Duration) (int, bool, error)

var modes = []struct {
	name string
	fn   waitFunc
}{
	{"Wait", (*Poller).Wait},
	{"WaitPark", (*Poller).WaitPark},
	{"WaitParkOnce", (*Poller).WaitParkOnce},
}

func bothModes(t *testing.T, test func(t *testing.T, w waitFunc)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { test(t, m.fn) })
	}
}

func wait(t *testing.T, w waitFunc, p *Poller, timeout time.Duration) ([]Event, bool) {
	t.Helper()
	evs := make([]Event, 8)
	n, woken, err := w(p, evs, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return evs[:n], woken
}

func TestReadinessAndTags(t *testing.T) { bothModes(t, testReadinessAndTags) }

func testReadinessAndTags(t *testing.T, w waitFunc) {
	tests := []struct {
		name string
		tag  uint64
		mode uint32
	}{
		{"level small tag", 7, 0},
		{"level high bits", 0xfedc_ba98_7654_3210, 0},
		{"edge", 1 << 40, ET},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := open(t)
			a, b := socketpair(t)
			if err := p.Add(a, In|RDHup|tc.mode, tc.tag); err != nil {
				t.Fatal(err)
			}
			if evs, _ := wait(t, w, p, 0); len(evs) != 0 {
				t.Fatalf("ready before any data: %+v", evs)
			}
			unix.Write(b, []byte("x"))
			evs, woken := wait(t, w, p, -1)
			if woken || len(evs) != 1 || evs[0].Tag != tc.tag || evs[0].Events&In == 0 {
				t.Fatalf("got %+v woken=%v, want one In event tagged %#x", evs, woken, tc.tag)
			}
			// Without reading: level-triggered reports again, edge does not.
			evs, _ = wait(t, w, p, 0)
			if again := len(evs) == 1; again != (tc.mode&ET == 0) {
				t.Fatalf("second wait reported %+v (edge=%v)", evs, tc.mode&ET != 0)
			}
		})
	}
}

func TestModifyAndDelete(t *testing.T) { bothModes(t, testModifyAndDelete) }

func testModifyAndDelete(t *testing.T, w waitFunc) {
	p := open(t)
	a, _ := socketpair(t)
	if err := p.Add(a, In, 1); err != nil {
		t.Fatal(err)
	}
	if evs, _ := wait(t, w, p, 0); len(evs) != 0 {
		t.Fatalf("unexpected %+v", evs)
	}
	// An empty socket is writable: asking for Out reports it with the new tag.
	if err := p.Modify(a, Out, 2); err != nil {
		t.Fatal(err)
	}
	if evs, _ := wait(t, w, p, 0); len(evs) != 1 || evs[0].Tag != 2 || evs[0].Events&Out == 0 {
		t.Fatalf("after Modify: %+v", evs)
	}
	if err := p.Delete(a); err != nil {
		t.Fatal(err)
	}
	if evs, _ := wait(t, w, p, 0); len(evs) != 0 {
		t.Fatalf("after Delete: %+v", evs)
	}
	if err := p.Delete(a); err == nil {
		t.Fatal("deleting twice succeeded")
	}
}

func TestWakeFromOtherGoroutine(t *testing.T) { bothModes(t, testWakeFromOtherGoroutine) }

func testWakeFromOtherGoroutine(t *testing.T, w waitFunc) {
	p := open(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := p.Wake(); err != nil {
			t.Error(err)
		}
	}()
	evs, woken := wait(t, w, p, -1)
	wg.Wait()
	if !woken || len(evs) != 0 {
		t.Fatalf("woken=%v events=%+v", woken, evs)
	}
	if _, woken := wait(t, w, p, 0); woken {
		t.Fatal("a consumed wake-up was reported twice")
	}
}

func TestWakeCoalesces(t *testing.T) { bothModes(t, testWakeCoalesces) }

func testWakeCoalesces(t *testing.T, w waitFunc) {
	p := open(t)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				p.Wake()
			}
		}()
	}
	wg.Wait()
	// All those calls left exactly one pending wake-up and one eventfd count.
	var buf [8]byte
	if _, woken := wait(t, w, p, -1); !woken {
		t.Fatal("not woken")
	}
	if _, err := unix.Read(p.efd, buf[:]); err != unix.EAGAIN {
		t.Fatalf("eventfd still readable after Wait: %v", err)
	}
	// And the next Wake works again.
	p.Wake()
	if _, woken := wait(t, w, p, -1); !woken {
		t.Fatal("second wake-up lost")
	}
}

func TestWaitTimeoutAndClose(t *testing.T) { bothModes(t, testWaitTimeoutAndClose) }

func testWaitTimeoutAndClose(t *testing.T, w waitFunc) {
	p, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]Event, 1)
	if n, woken, err := w(p, evs, time.Millisecond); n != 0 || woken || err != nil {
		t.Fatalf("Wait on an empty poller: %d %v %v", n, woken, err)
	}
	if _, _, err := w(p, nil, 0); err == nil {
		t.Fatal("Wait with no room succeeded")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != ErrClosed {
		t.Fatalf("second Close = %v", err)
	}
}

func BenchmarkWakeWait(b *testing.B) { benchWake(b, (*Poller).Wait) }

func BenchmarkWakeWaitPark(b *testing.B) { benchWake(b, (*Poller).WaitPark) }

// benchWake times a wake-up and the wait it ends, waiting with wait.
func benchWake(b *testing.B, wait func(p *Poller, events []Event, timeout time.Duration) (int, bool, error)) {
	p, err := Open()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	evs := make([]Event, 4)
	b.ReportAllocs()
	for b.Loop() {
		p.Wake()
		wait(p, evs, -1)
	}
}

// TestWaitParkOnceParks checks that WaitParkOnce waits parked in the
// runtime's netpoller ("IO wait", holding no P), not blocked in epoll_wait,
// that Wake and readiness end it there, and that it leaves no descriptor
// behind (its duplicate is the netpoller's for that wait only).
func TestWaitParkOnceParks(t *testing.T) {
	p := open(t)
	a, b := socketpair(t)
	if err := p.Add(a, In|ET, 7); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n     int
		woken bool
		err   error
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	for _, end := range []string{"wake", "readable"} {
		t.Run(end, func(t *testing.T) {
			done := make(chan result, 1)
			go func() {
				evs := make([]Event, 4)
				n, woken, err := p.WaitParkOnce(evs, -1)
				done <- result{n, woken, err}
			}()
			parked := func() bool {
				buf := make([]byte, 1<<20)
				for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
					if strings.Contains(g, "(*Poller).WaitParkOnce") {
						return strings.Contains(g, "[IO wait")
					}
				}
				return false
			}
			if !nettest.Until(10*time.Second, parked) {
				t.Fatal("WaitParkOnce never parked in the netpoller")
			}
			var want result
			switch end {
			case "wake":
				want = result{0, true, nil}
				if err := p.Wake(); err != nil {
					t.Fatal(err)
				}
			case "readable":
				want = result{1, false, nil}
				if _, err := unix.Write(b, []byte{1}); err != nil {
					t.Fatal(err)
				}
			}
			if got := <-done; got != want {
				t.Fatalf("parked wait ended with %+v, want %+v", got, want)
			}
		})
	}
	if after := fds(); after != before {
		t.Fatalf("%d descriptors open after the parked waits, %d before", after, before)
	}
}

// TestWaitModesLoseNoWake wakes a waiter that switches between the
// blocking and the parked wait at random: every Wake must end a wait,
// whichever wait (or the switch between them) it meets.
func TestWaitModesLoseNoWake(t *testing.T) {
	p := open(t)
	acks := make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		evs := make([]Event, 4)
		rng := rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			wait := p.Wait
			if rng.IntN(2) == 0 {
				wait = p.WaitParkOnce
			}
			_, woken, err := wait(evs, time.Duration(rng.IntN(3))*time.Millisecond)
			if err != nil {
				t.Error(err)
				return
			}
			if woken {
				select {
				case acks <- struct{}{}:
				case <-stop:
					return
				}
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		time.Sleep(time.Duration(rng.IntN(2500)) * time.Microsecond)
		if err := p.Wake(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-acks:
		case <-time.After(10 * time.Second):
			t.Fatalf("wake %d lost", i)
		}
	}
}
