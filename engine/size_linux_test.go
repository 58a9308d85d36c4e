package engine

import (
	"testing"
	"unsafe"
)

// TestRelaySizeClass guards the size of what an idle relay holds: each
// record is allocated alone, so a field more moves it to the next malloc
// size class for every idle connection.
func TestRelaySizeClass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"streamRelay", unsafe.Sizeof(streamRelay{}), 224},
		{"tcpRelay", unsafe.Sizeof(tcpRelay{}), 144},
		{"session", unsafe.Sizeof(session{}), 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.size > tc.max {
				t.Errorf("%s is %d bytes, more than its budget of %d (a malloc size class)", tc.name, tc.size, tc.max)
			}
			t.Logf("%s: %d bytes", tc.name, tc.size)
		})
	}
}
