//go:build race

package hbone

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts mean nothing under it.
const raceEnabled = true

// raceSlowdown stretches the tests' hang guards: under the race detector on
// a loaded 2-core machine a flood test's reader parses 5-10x slower, and the
// guard must still only catch hangs.
const raceSlowdown = 3
