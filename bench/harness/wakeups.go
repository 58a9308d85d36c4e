package harness

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
)

// Wake-ups from a Go execution trace, as `go tool trace -d=parsed` prints
// it: every Waiting→Runnable transition is one goroutine waking another (or
// the scheduler's netpoll, G=-1, waking it on a ready fd). A goroutine is
// named by the outermost frame of this module's code (else the innermost
// frame) on the stack it last blocked with, which is what it runs (the
// loop's run, a connection's reader); a wake by the innermost frame of ours
// on the waker's stack, which is the call that woke. The census divides the counts
// by the trace's round trips.

// Wake is one kind of wake-up: who woke whom, by which call.
type Wake struct {
	Waker string  `json:"waker"` // "netpoll" when the scheduler found the fd ready
	Via   string  `json:"via,omitempty"`
	Wakee string  `json:"wakee"`
	Count float64 `json:"count"` // per round trip once the census divides
}

// modulePrefix marks the frames of our code in a stack.
const modulePrefix = "github.com/ztunnel-go/ztunnel/"

// traceWakeups runs `go tool trace -d=parsed` on file and counts its
// wake-ups by kind, and the syscalls the traced goroutines entered.
func traceWakeups(ctx context.Context, file string) ([]Wake, int64, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "trace", "-d=parsed", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("go tool trace: %w", err)
	}
	wakes, syscalls, perr := parseWakeups(out)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return nil, 0, fmt.Errorf("go tool trace %s: %w", file, err)
	}
	return wakes, syscalls, perr
}

// parseWakeups reads the parsed trace; see traceWakeups.
func parseWakeups(r io.Reader) ([]Wake, int64, error) {
	role := map[string]string{} // goroutine ID → what it last blocked in
	counts := map[Wake]float64{}
	var syscalls int64
	// The event being read, and its stacks' first frames.
	var ev struct {
		g, goID, transition string
		stack, transStack   string
		inTrans             bool
		frames              int
	}
	flush := func() {
		switch ev.transition {
		case "Running->Waiting":
			if ev.transStack != "" {
				role[ev.goID] = ev.transStack
			}
		case "Waiting->Runnable":
			w := Wake{Waker: "netpoll", Via: ev.stack, Wakee: cmp.Or(role[ev.goID], "g"+ev.goID)}
			if ev.g != "-1" {
				w.Waker = cmp.Or(role[ev.g], "g"+ev.g)
			}
			counts[w]++
		case "Running->Syscall":
			syscalls++
		}
		ev.transition, ev.stack, ev.transStack = "", "", ""
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "M="):
			flush()
			f := strings.Fields(line)
			if len(f) < 6 || f[3] != "StateTransition" || !strings.HasPrefix(f[5], "GoID=") {
				continue
			}
			ev.g = strings.TrimPrefix(f[2], "G=")
			ev.goID = strings.TrimPrefix(f[5], "GoID=")
			ev.transition = f[6]
		case line == "Stack=" || line == "TransitionStack=":
			ev.inTrans, ev.frames = line == "TransitionStack=", 0
		case strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t") && ev.transition != "":
			fn, _, _ := strings.Cut(strings.TrimPrefix(line, "\t"), " @ ")
			dst := &ev.stack
			if ev.inTrans {
				dst = &ev.transStack
			}
			// Ours wins over the runtime's; of ours, the outermost names a
			// goroutine and the innermost a wake. The innermost frame
			// stands in until one of ours comes.
			ours, had := strings.HasPrefix(fn, modulePrefix), strings.HasPrefix(*dst, modulePrefix)
			if ev.frames == 0 || (ours && (!had || ev.inTrans)) {
				*dst = fn
			}
			ev.frames++
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	out := make([]Wake, 0, len(counts))
	for w, n := range counts {
		w.Waker, w.Via, w.Wakee = short(w.Waker), short(w.Via), short(w.Wakee)
		w.Count = n
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Wake) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Waker+a.Via+a.Wakee, b.Waker+b.Via+b.Wakee)
	})
	return out, syscalls, nil
}

// short drops the module path from a function name.
func short(fn string) string { return strings.TrimPrefix(fn, modulePrefix) }
