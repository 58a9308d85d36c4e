package main

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRejects(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"copy", "--to", "127.0.0.1:1", "--duration", "1s"},                                              // no listen
		{"copy", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1"},                                       // unbounded
		{"copy", "--listen", "127.0.0.1:0", "--duration", "1s"},                                          // nowhere to go
		{"copy", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1", "--original-dst", "--duration", "1s"}, // both
		{"tls", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1", "--duration", "1s"},                    // no certificate
		{"bogus", "--listen", "127.0.0.1:0", "--duration", "1s"},
	} {
		if err := run(context.Background(), args); err == nil {
			t.Errorf("zpeer %q succeeded", args)
		}
	}
}

func TestCopyIsBounded(t *testing.T) {
	if err := run(context.Background(), []string{"copy", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1",
		"--pprof", "127.0.0.1:0", "--duration", "50ms"}); err != nil {
		t.Fatal(err)
	}
}
