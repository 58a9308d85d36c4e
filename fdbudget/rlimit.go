//go:build unix

package fdbudget

import (
	"math"
	"syscall"
)

// NoFileLimit returns the soft RLIMIT_NOFILE, the descriptors the process
// may hold (Go's runtime raised it to the hard limit at start-up, as
// ztunnel does in main.rs). An unlimited or unreadable limit reads as 0.
func NoFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == math.MaxUint64 {
		return 0
	}
	return int(min(rl.Cur, math.MaxInt32))
}
