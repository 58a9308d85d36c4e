//go:build !assert

package splice

// assertions enables the pool's ownership checks (a pipe put back twice, a
// count gone negative); build with -tags assert to turn them on.
const assertions = false
