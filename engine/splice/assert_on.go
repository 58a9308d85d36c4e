//go:build assert

package splice

const assertions = true
