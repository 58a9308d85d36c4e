//go:build assert

package engine

const assertions = true
