package state

import (
	"testing"
	"unsafe"
)

// TestWorkloadSizeClass keeps the per-workload record within its malloc
// size class (issue 36: 100,000 of them in a large mesh). 352 bytes is a
// size class; the next one is 384.
func TestWorkloadSizeClass(t *testing.T) {
	if size, budget := unsafe.Sizeof(Workload{}), uintptr(352); size > budget {
		t.Errorf("Workload is %d bytes, more than its budget of %d (a malloc size class)", size, budget)
	}
}
