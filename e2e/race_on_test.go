//go:build race

package e2e

// raceEnabled builds the daemon under test with the race detector when the
// tests themselves run with it, so `make test` checks the daemon too.
const raceEnabled = true
