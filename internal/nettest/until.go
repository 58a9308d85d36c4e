package nettest

import "time"

// Until reports whether cond holds within limit, checking it at once and
// then at an interval that grows from 100 µs to 10 ms, so a condition met
// quickly is seen quickly and a slow one costs few checks. It is for what
// no channel or callback signals (counters, stats, log lines, goroutine
// counts); where the code under test offers a signal, wait on that instead.
// The caller fails the test on false, with what it last saw.
func Until(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for pause := 100 * time.Microsecond; !cond(); pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(pause)
	}
	return true
}
