package load

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Main is the main function of the bench commands (zload, zpeer, zbench),
// so that they end alike: run gets a context that SIGINT or SIGTERM
// cancels (a run cut short still reports what it has) and the arguments; a
// flag.ErrHelp exits 2 (the flag set has printed its usage), any other
// error is printed as "name: error" and exits 1.
func Main(name string, run func(ctx context.Context, args []string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// StringList is a repeatable string flag (flag.Var): each use appends.
type StringList []string

// String returns the values joined by commas, for the flag's usage.
func (s *StringList) String() string { return strings.Join(*s, ",") }

// Set appends v.
func (s *StringList) Set(v string) error { *s = append(*s, v); return nil }
