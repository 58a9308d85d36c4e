// Package fuzzseed lets a fuzz target register its seeds once and have them
// both added with f.Add and, on request, written out as the checked-in seed
// corpus under testdata/fuzz/<FuzzName>/ in go's corpus file format. Imports
// (of ours): nothing of ours. Imported by: tests.
package fuzzseed
