package proxy

import (
	"testing"
	"unsafe"
)

// TestConnSizeClass guards the size of the record every idle relayed
// connection holds: a field more moves it to the next malloc size class
// (208 after 192) for every connection.
func TestConnSizeClass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"conn", unsafe.Sizeof(conn{}), 192},
		// Held by every HBONE-carried or redirected connection.
		{"connExt", unsafe.Sizeof(connExt{}), 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.size > tc.max {
				t.Errorf("%s is %d bytes, more than its budget of %d (a malloc size class)", tc.name, tc.size, tc.max)
			}
			t.Logf("%s: %d bytes", tc.name, tc.size)
		})
	}
}
