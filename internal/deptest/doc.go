// Package deptest checks the module's import layering and package docs: each
// package may import only the packages of this module that ARCHITECTURE.md
// allows it, and every package has exactly one package doc comment.
//
// It has tests only; nothing imports it.
package deptest
