package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates into a temporary directory and
// compares with the checked-in api/ files, so that a proto edited without
// `make generate` fails the tests (CI also checks with git diff).
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the code generator")
	}
	out := t.TempDir()
	if err := run("..", "../..", out); err != nil {
		t.Fatal(err)
	}
	fresh, err := filepath.Glob(filepath.Join(out, "api", "*", "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	checkedIn, err := filepath.Glob(filepath.Join("../..", "api", "*", "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != len(checkedIn) || len(fresh) == 0 {
		t.Fatalf("%d generated files, %d checked in", len(fresh), len(checkedIn))
	}
	for _, f := range fresh {
		rel, _ := filepath.Rel(out, f)
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("../..", rel))
		if err != nil {
			t.Errorf("%s: %v (run make generate)", rel, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make generate", rel)
		}
	}
}
