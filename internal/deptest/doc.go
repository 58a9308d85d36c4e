// Package deptest checks the module's import layering and package docs: each
// package may import only the packages of this module that its layer allows,
// every package has exactly one package doc comment, and ARCHITECTURE.md's
// package table and the package docs' "Imports (of ours)" and "Imported by"
// sentences match the code. It has tests only. Imports (of ours): nothing of
// ours. Imported by: nothing.
package deptest
