package fuzzseed

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// WriteEnv is the environment variable that, set to 1, makes Add also write
// each seed to testdata/fuzz/<FuzzName>/seed-NN of the package under test:
//
//	ZTUNNEL_FUZZ_WRITE_SEEDS=1 go test -run '^Fuzz' ./...
//
// regenerates every checked-in seed corpus from the seeds the targets add
// (real protos, certificates and frames built by the test helpers), so the
// corpus never drifts from the code that makes it.
const WriteEnv = "ZTUNNEL_FUZZ_WRITE_SEEDS"

var (
	mu sync.Mutex
	// counts numbers each target's seeds, so that regenerating overwrites
	// the same files rather than adding new ones.
	counts = map[*testing.F]int{}
)

// Add calls f.Add(args...) and, when WriteEnv is 1, also writes the seed as
// a corpus file. Each argument must be one of the types go's fuzzing engine
// takes.
func Add(f *testing.F, args ...any) {
	f.Helper()
	f.Add(args...)
	if os.Getenv(WriteEnv) != "1" {
		return
	}
	data, err := Marshal(args...)
	if err != nil {
		f.Fatalf("fuzzseed: %v", err)
	}
	mu.Lock()
	n := counts[f]
	counts[f] = n + 1
	mu.Unlock()
	dir := filepath.Join("testdata", "fuzz", f.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatalf("fuzzseed: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", n)), data, 0o644); err != nil {
		f.Fatalf("fuzzseed: %v", err)
	}
}

// Marshal encodes values in go's corpus file format ("go test fuzz v1").
// It supports the argument types our targets use; others are an error
// rather than a file the fuzzing engine would refuse to read.
func Marshal(args ...any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case byte:
			fmt.Fprintf(&b, "byte(%q)\n", v)
		case int, int8, int16, int64, uint, uint16, uint32, uint64, bool:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		default:
			return nil, fmt.Errorf("unsupported seed type %T", a)
		}
	}
	return b.Bytes(), nil
}
