//go:build !race

package hbone

const raceEnabled = false

// raceSlowdown is 1 without the race detector (see race_test.go).
const raceSlowdown = 1
