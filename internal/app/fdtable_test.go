package app

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// fdTableSize reads the process's descriptor table size (FDSize in
// /proc/self/status).
func fdTableSize(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("FDSize:")); ok {
			n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no FDSize in /proc/self/status")
	return 0
}

// TestGrowFDTable checks that the descriptor table is sized up front for
// what RLIMIT_NOFILE allows (up to FDTableCap), so that no socket the
// daemon makes later waits for the kernel to grow it, and that every
// descriptor open before is still open.
func TestGrowFDTable(t *testing.T) {
	limit := fdbudget.NoFileLimit()
	if limit < 256 {
		t.Fatalf("RLIMIT_NOFILE %d: too low to check", limit)
	}
	want := min(limit, FDTableCap)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := GrowFDTable(); got != want {
		t.Fatalf("GrowFDTable sized %d, want %d", got, want)
	}
	if size := fdTableSize(t); size < want {
		t.Fatalf("descriptor table has %d slots after GrowFDTable, want at least %d", size, want)
	}
	if _, err := f.Stat(); err != nil {
		t.Fatalf("a descriptor open before: %v", err)
	}
}
