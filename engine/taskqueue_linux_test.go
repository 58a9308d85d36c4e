package engine

import "testing"

// TestTaskQueueAwake: while the loop is awake a submit only queues; the
// loop's sleep, with nothing queued, makes the next submit wake it, and
// a sleep with tasks queued is refused.
func TestTaskQueueAwake(t *testing.T) {
	var q taskQueue[int]
	starts, wakes := 0, 0
	start, wake := func() { starts++ }, func() { wakes++ }
	steps := []struct {
		name         string
		do           func()
		starts, wake int
	}{
		{"first submit starts the loop", func() { q.submit(1, start, wake) }, 1, 0},
		{"not awake yet: wake", func() { q.submit(2, start, wake) }, 1, 1},
		{"awake: queue only", func() { q.awake.Store(true); q.submit(3, start, wake) }, 1, 1},
		{"sleep refused with tasks queued", func() {
			if q.sleep() {
				t.Fatal("sleep with tasks queued")
			}
			q.submit(4, start, wake)
		}, 1, 1},
		{"drained and asleep: wake", func() {
			if got := q.take(); len(got) != 4 {
				t.Fatalf("took %v", got)
			}
			if !q.sleep() {
				t.Fatal("sleep refused with nothing queued")
			}
			q.submit(5, start, wake)
		}, 1, 2},
	}
	for _, s := range steps {
		s.do()
		if starts != s.starts || wakes != s.wake {
			t.Fatalf("%s: %d starts, %d wakes; want %d, %d", s.name, starts, wakes, s.starts, s.wake)
		}
	}
}
