//go:build !assert

package engine

// assertions enables the engine's internal consistency checks; build with
// -tags assert to turn them on (tests and debugging), off they cost nothing.
const assertions = false
