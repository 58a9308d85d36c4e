// Package deptest checks the module's import layering and package docs: each
// package may import only the packages of this module that its layer allows,
// every package has exactly one package doc comment, ARCHITECTURE.md's
// package table and the package docs' "Imports (of ours)" and "Imported by"
// sentences match the code, and each design note's status line
// (docs/design/*.md) agrees with the identifiers it names. It has tests only.
// Imports (of ours): nothing of ours. Imported by: nothing.
package deptest
