package hbone

import (
	"testing"
	"unsafe"
)

// TestStreamSizeClass guards the size of what an idle relayed stream holds:
// each record is allocated alone, so a field more moves it to the next
// malloc size class (288 after 256) for every idle connection.
func TestStreamSizeClass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"Stream", unsafe.Sizeof(Stream{}), 240},
		{"handlerCtx", unsafe.Sizeof(handlerCtx{}), 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.size > tc.max {
				t.Errorf("%s is %d bytes, more than its budget of %d (a malloc size class)", tc.name, tc.size, tc.max)
			}
		})
	}
}
