package harness

import (
	"strings"
	"testing"
)

// strace 6.1's `strace -c -f` table, errors column present on some rows.
const straceSummary = `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.20    0.120000          12     10000           write
 30.10    0.090000           4     20000     10000 read
 20.00    0.060000           3     20001           epoll_pwait
  8.70    0.026000           2     13000      1200 futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.296000           4     63001     11200 total
`

func TestParseStraceSummary(t *testing.T) {
	calls, errs, err := parseStraceSummary([]byte(straceSummary))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"write": 10000, "read": 20000, "epoll_pwait": 20001, "futex": 13000}
	if len(calls) != len(want) {
		t.Fatalf("calls %v, want %v (no total row)", calls, want)
	}
	for k, v := range want {
		if calls[k] != v {
			t.Errorf("calls[%s] = %d, want %d", k, calls[k], v)
		}
	}
	if errs["read"] != 10000 || errs["futex"] != 1200 || errs["write"] != 0 {
		t.Errorf("errors %v", errs)
	}
	if _, _, err := parseStraceSummary([]byte("strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n")); err == nil {
		t.Error("no table: want an error")
	}
}

func TestParseCtxtSwitches(t *testing.T) {
	v, iv := parseCtxtSwitches([]byte("Name:\tztunnel\nThreads:\t7\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n"))
	if v != 1234 || iv != 56 {
		t.Fatalf("got %d, %d; want 1234, 56", v, iv)
	}
}

func TestCensusMarkdown(t *testing.T) {
	md := CensusMarkdown([]Census{{Config: "hbone2/x", RoundTrips: 100, P50us: 300, Procs: []CensusProc{{
		Proc: "d1", Syscalls: map[string]float64{"read": 2, "write": 1, "futex": 1, "getpid": 0.001},
		Straced: map[string]float64{"read": 2, "write": 1, "nanosleep": 4},
		Errors:  map[string]float64{"read": 1}, Voluntary: 3, Involuntary: 0.5, CPUus: 40,
	}}}})
	for _, want := range []string{"## hbone2/x", "| d1 | 4.00 | read 2.00, futex 1.00, write 1.00 | 7.00 | read 1.00 | 3.00 | 0.50 | 40.0 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("census markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "getpid") {
		t.Errorf("a kind under 0.01 per round trip is listed:\n%s", md)
	}
}

func TestParsePerfStat(t *testing.T) {
	out := "# started on Thu Dec  3 06:49:20 2026\n\n" +
		"1000,,raw_syscalls:sys_enter,1002076470,100.00,,\n" +
		"600,,syscalls:sys_enter_read,1002076470,100.00,,\n" +
		"0,,syscalls:sys_enter_splice,1002076470,100.00,,\n" +
		"<not supported>,,syscalls:sys_enter_epoll_pwait2,0,100.00,,\n" +
		"300,,syscalls:sys_enter_write,1002076470,100.00,,\n"
	m := parsePerfStat([]byte(out))
	if len(m) != 3 || m["read"] != 600 || m["write"] != 300 || m["other"] != 100 {
		t.Fatalf("got %v, want read 600, write 300, other 100", m)
	}
	if m := parsePerfStat([]byte("<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n")); m != nil {
		t.Fatalf("nothing counted: got %v, want nil", m)
	}
}

// A cut of `go tool trace -d=parsed`: the loop (G66) parks, the TLS reader
// (G12) blocks, netpoll wakes G12, G12 wakes the loop.
const parsedTrace = `M=1 P=0 G=66 StateTransition Time=1 GoID=66 Running->Waiting Reason="network"
TransitionStack=
	internal/poll.(*FD).RawRead @ 0x50930c
		internal/poll/fd_unix.go:710
	github.com/ztunnel-go/ztunnel/engine/poll.(*Poller).WaitPark @ 0xab8670
		github.com/ztunnel-go/ztunnel/engine/poll/poll_linux.go:234
	github.com/ztunnel-go/ztunnel/engine.(*eloop).run @ 0xabfb4e
		github.com/ztunnel-go/ztunnel/engine/loop.go:1
M=1 P=1 G=12 StateTransition Time=2 GoID=12 Running->Waiting Reason="network"
TransitionStack=
	internal/poll.(*FD).RawRead @ 0x50930c
		internal/poll/fd_unix.go:710
	github.com/ztunnel-go/ztunnel/mtls/record.(*Conn).fillEmptyLocked @ 0xb09395
		github.com/ztunnel-go/ztunnel/mtls/record/conn.go:462
M=1 P=-1 G=-1 StateTransition Time=3 GoID=12 Waiting->Runnable Reason=""
M=1 P=1 G=12 StateTransition Time=4 GoID=12 Running->Syscall Reason=""
TransitionStack=
	syscall.read @ 0x4aeab7
		syscall/zsyscall_linux_amd64.go:736
M=1 P=1 G=12 StateTransition Time=5 GoID=66 Waiting->Runnable Reason=""
Stack=
	internal/poll.setDeadlineImpl @ 0x503a73
		internal/poll/fd_poll_runtime.go:162
	github.com/ztunnel-go/ztunnel/engine/poll.(*Poller).Wake @ 0xab8aff
		github.com/ztunnel-go/ztunnel/engine/poll/poll_linux.go:292
	github.com/ztunnel-go/ztunnel/engine.(*eloop).wake @ 0xacf71a
		github.com/ztunnel-go/ztunnel/engine/loop.go:2
M=1 P=1 G=-1 StateTransition Time=6 GoID=7 Waiting->Runnable Reason=""
`

func TestParseWakeups(t *testing.T) {
	wakes, syscalls, err := parseWakeups(strings.NewReader(parsedTrace))
	if err != nil {
		t.Fatal(err)
	}
	// Equal counts sort by waker, via and wakee.
	want := []Wake{
		{Waker: "mtls/record.(*Conn).fillEmptyLocked", Via: "engine/poll.(*Poller).Wake", Wakee: "engine.(*eloop).run", Count: 1},
		{Waker: "netpoll", Via: "", Wakee: "g7", Count: 1},
		{Waker: "netpoll", Via: "", Wakee: "mtls/record.(*Conn).fillEmptyLocked", Count: 1},
	}
	if len(wakes) != len(want) {
		t.Fatalf("wakes %+v, want %+v", wakes, want)
	}
	for i := range want {
		if wakes[i] != want[i] {
			t.Errorf("wake %d: %+v, want %+v", i, wakes[i], want[i])
		}
	}
	if syscalls != 1 {
		t.Errorf("syscalls %d, want 1", syscalls)
	}
}

func TestParsePerfReport(t *testing.T) {
	// perf report --stdio -q --no-children -n --sort sym, as perf 6 writes
	// it (a dd run on the CI machine kind), plus lines it must skip.
	out := []byte(`    29.46%           104  [k] do_syscall_64
    15.01%            53  [k] read_zero
    10.48%            37  [.] read
     9.92%            35  [.] __GI___libc_write
     4.25%            15  [k] fdget_pos
     1.13%             4  [.] intel_check_word.constprop.0
     0.28%             1  [.] 0x00000000004a95a8
#
garbage line
     1.00%          many  [k] not_a_count
`)
	// 1000 round trips sampled at 1000 Hz: one sample is 1000 µs / 1000.
	s := parsePerfReport(out, 1000*1000/1e6)
	if s.KernelUS != 172 || s.UserUS != 77 {
		t.Fatalf("kernel %v user %v µs, want 172 and 77", s.KernelUS, s.UserUS)
	}
	if len(s.TopKernel) != 3 || s.TopKernel[0] != (SymbolCost{"do_syscall_64", 104}) || s.TopKernel[2].Symbol != "fdget_pos" {
		t.Errorf("top kernel: %+v", s.TopKernel)
	}
	if len(s.TopUser) != 4 || s.TopUser[3] != (SymbolCost{"0x00000000004a95a8", 1}) {
		t.Errorf("top user: %+v", s.TopUser)
	}
	md := sampledMarkdown("d1", &s)
	if !strings.Contains(md, "kernel 172.0 µs + user 77.0 µs") || !strings.Contains(md, "read_zero 53.0") {
		t.Errorf("markdown: %s", md)
	}
	if sampledMarkdown("d1", nil) != "" {
		t.Error("a process without samples has a perf line")
	}
}
