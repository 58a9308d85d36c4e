package deptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The import claims the docs make, checked against the code, so that they
// cannot go stale when an import is added or removed:
//
//   - ARCHITECTURE.md's package table: one row per package of the module
//     (several packages may share a row), whose "Imports (of ours)" column lists
//     exactly the packages of ours the row's packages import from outside the
//     row (a `dir/*` entry stands for any packages under dir; "everything
//     below" is not checked but must be true by the order), and whose imports
//     point down the table only.
//   - Each package doc (other than a command's) carries the two sentences
//     "Imports (of ours): a, b and c." and "Imported by: x, y and tests.",
//     which list exactly the packages of ours it imports and the non-test
//     packages that import it ("tests", when listed, must be true: some other
//     package's tests import it).
//
// Test files are not imports for the table or for "Imports (of ours)": the
// layering lets tests use test kits.

const (
	importsKey    = "Imports (of ours): "
	importedByKey = "Imported by: "
	// nothingOfOurs is the item that says a list is empty.
	nothingOfOurs = "nothing of ours"
	nothing       = "nothing"
	testsItem     = "tests"
)

// modPkg is what the claims are checked against, from go list.
type modPkg struct {
	ImportPath   string
	Name         string
	Dir          string
	GoFiles      []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// modGraph is the module's import graph between its own packages, by path
// relative to the module root.
type modGraph struct {
	pkgs      map[string]modPkg
	imports   map[string][]string // non-test imports of ours
	importers map[string][]string // non-test packages of ours importing it
	testUsers map[string][]string // other packages whose tests import it
}

func loadGraph(t *testing.T) *modGraph {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := &modGraph{pkgs: map[string]modPkg{}, imports: map[string][]string{},
		importers: map[string][]string{}, testUsers: map[string][]string{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p modPkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := relPath(p.ImportPath)
		if rel == "internal/tools" { // build-tagged module pins, not code
			continue
		}
		g.pkgs[rel] = p
	}
	for rel, p := range g.pkgs {
		for _, imp := range p.Imports {
			if dep, ok := g.ours(imp); ok {
				g.imports[rel] = append(g.imports[rel], dep)
				g.importers[dep] = append(g.importers[dep], rel)
			}
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if dep, ok := g.ours(imp); ok && dep != rel && !slices.Contains(g.testUsers[dep], rel) {
				g.testUsers[dep] = append(g.testUsers[dep], rel)
			}
		}
	}
	return g
}

func relPath(importPath string) string {
	return strings.TrimPrefix(strings.TrimPrefix(importPath, module), "/")
}

// ours reports whether imp is a package of this module, and its relative path.
func (g *modGraph) ours(imp string) (string, bool) {
	if !strings.HasPrefix(imp, module+"/") {
		return "", false
	}
	rel := relPath(imp)
	_, ok := g.pkgs[rel]
	return rel, ok
}

// diff describes how the claimed set differs from the true one, or "".
func diff(claimed, actual []string) string {
	var missing, extra []string
	for _, a := range actual {
		if !slices.Contains(claimed, a) {
			missing = append(missing, a)
		}
	}
	for _, c := range claimed {
		if !slices.Contains(actual, c) {
			extra = append(extra, c)
		}
	}
	if missing == nil && extra == nil {
		return ""
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return fmt.Sprintf("missing %v, not true %v", missing, extra)
}

// listItems splits "a, b and c" (parentheticals removed) into its items.
func listItems(s string) []string {
	s = dropParens(s)
	var items []string
	for _, part := range strings.Split(s, ",") {
		for _, item := range strings.Split(part, " and ") {
			if item = strings.TrimSpace(strings.Trim(strings.TrimSpace(item), "`")); item != "" && item != "and" {
				items = append(items, strings.TrimPrefix(item, "and "))
			}
		}
	}
	return items
}

func dropParens(s string) string {
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sentenceAfter returns the text after key up to the end of its sentence (a
// period outside parentheses followed by a space or the end), and whether key
// occurs exactly once.
func sentenceAfter(text, key string) (string, int) {
	n := strings.Count(text, key)
	i := strings.Index(text, key)
	if i < 0 {
		return "", 0
	}
	rest := text[i+len(key):]
	depth := 0
	for j, r := range rest {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case '.':
			if depth == 0 && (j+1 == len(rest) || rest[j+1] == ' ') {
				return rest[:j], n
			}
		}
	}
	return rest, n
}

// packageDoc returns the package's doc comment as one line of text.
func packageDoc(t *testing.T, p modPkg) string {
	t.Helper()
	for _, f := range p.GoFiles {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if file.Doc != nil {
			return strings.Join(strings.Fields(file.Doc.Text()), " ")
		}
	}
	return ""
}

func TestPackageDocImportClaims(t *testing.T) {
	g := loadGraph(t)
	for _, rel := range slices.Sorted(maps.Keys(g.pkgs)) {
		p := g.pkgs[rel]
		if p.Name == "main" {
			continue
		}
		doc := packageDoc(t, p)
		for _, e := range checkDocClaims(g, rel, doc) {
			t.Errorf("%s (package doc): %s", rel, e)
		}
	}
}

// checkDocClaims returns what is wrong with the import claims of rel's doc.
func checkDocClaims(g *modGraph, rel, doc string) []string {
	var errs []string
	imports, n := sentenceAfter(doc, importsKey)
	switch {
	case n == 0:
		errs = append(errs, fmt.Sprintf("no %q sentence; the true one is %q", importsKey, importsKey+sentence(g.imports[rel], nil)))
	case n > 1:
		errs = append(errs, fmt.Sprintf("%d %q sentences, want one", n, importsKey))
	default:
		claimed, bad := g.resolve(listItems(imports), false)
		errs = append(errs, bad...)
		if d := diff(claimed, g.imports[rel]); d != "" {
			errs = append(errs, fmt.Sprintf("%q is wrong (%s); the true one is %q", importsKey+imports+".", d, importsKey+sentence(g.imports[rel], nil)))
		}
	}
	by, n := sentenceAfter(doc, importedByKey)
	switch {
	case n == 0:
		errs = append(errs, fmt.Sprintf("no %q sentence; the true one is %q", importedByKey, importedByKey+sentence(g.importers[rel], g.testUsers[rel])))
	case n > 1:
		errs = append(errs, fmt.Sprintf("%d %q sentences, want one", n, importedByKey))
	default:
		items := listItems(by)
		claimed, bad := g.resolve(items, true)
		errs = append(errs, bad...)
		if d := diff(claimed, g.importers[rel]); d != "" {
			errs = append(errs, fmt.Sprintf("%q is wrong (%s); the true one is %q", importedByKey+by+".", d, importedByKey+sentence(g.importers[rel], g.testUsers[rel])))
		}
		if slices.Contains(items, testsItem) && len(g.testUsers[rel]) == 0 {
			errs = append(errs, fmt.Sprintf("%q names tests, but no other package's tests import it", importedByKey+by+"."))
		}
	}
	return errs
}

// resolve maps a claim's items to packages of ours; words it does not know are
// returned as errors, so a typo or a stale name cannot pass.
func (g *modGraph) resolve(items []string, importers bool) (pkgs []string, errs []string) {
	for _, it := range items {
		switch {
		case it == nothingOfOurs || it == nothing:
		case importers && it == testsItem:
		default:
			if _, ok := g.pkgs[it]; !ok {
				errs = append(errs, fmt.Sprintf("%q is not a package of this module", it))
				continue
			}
			pkgs = append(pkgs, it)
		}
	}
	return pkgs, errs
}

// sentence renders the true list for an error message.
func sentence(pkgs, testUsers []string) string {
	items := slices.Sorted(slices.Values(pkgs))
	if len(testUsers) > 0 {
		items = append(items, testsItem)
	}
	switch len(items) {
	case 0:
		return nothingOfOurs + "."
	case 1:
		return items[0] + "."
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1] + "."
}

// archRow is one row of ARCHITECTURE.md's package table.
type archRow struct {
	line    int
	pkgs    []string
	claims  []string // "Imports (of ours)" entries; nil for none
	unknown bool     // the column says "everything below": only the order is checked
}

// parseArchTable reads the table under the "## Packages" heading of md.
func parseArchTable(md string) ([]archRow, error) {
	var rows []archRow
	in := false
	for i, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## Packages")
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 3 {
			return nil, fmt.Errorf("ARCHITECTURE.md:%d: want 3 columns: %s", i+1, line)
		}
		r := archRow{line: i + 1, pkgs: backticked(cols[0])}
		switch c := strings.TrimSpace(cols[2]); c {
		case "—", "(tests only)":
		case "everything below":
			r.unknown = true
		default:
			r.claims = backticked(c)
			if len(r.claims) == 0 {
				return nil, fmt.Errorf("ARCHITECTURE.md:%d: imports column %q names no package", i+1, c)
			}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("ARCHITECTURE.md: no package table under a \"## Packages\" heading")
	}
	return rows, nil
}

// backticked returns the `quoted` names of s.
func backticked(s string) []string {
	var out []string
	parts := strings.Split(s, "`")
	for i := 1; i < len(parts); i += 2 {
		out = append(out, parts[i])
	}
	return out
}

func TestArchitectureImportTable(t *testing.T) {
	g := loadGraph(t)
	md, err := os.ReadFile(filepath.Join("..", "..", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := parseArchTable(string(md))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range checkArchTable(g, rows) {
		t.Error(e)
	}
}

// checkArchTable returns what is wrong with the table's rows.
func checkArchTable(g *modGraph, rows []archRow) []string {
	var errs []string
	rowOf := map[string]int{}
	for i, r := range rows {
		for _, p := range r.pkgs {
			if _, ok := g.pkgs[p]; !ok {
				errs = append(errs, fmt.Sprintf("ARCHITECTURE.md:%d: `%s` is not a package of this module", r.line, p))
				continue
			}
			if j, dup := rowOf[p]; dup {
				errs = append(errs, fmt.Sprintf("ARCHITECTURE.md:%d: `%s` already has the row on line %d", r.line, p, rows[j].line))
			}
			rowOf[p] = i
		}
	}
	for _, p := range slices.Sorted(maps.Keys(g.pkgs)) {
		if _, ok := rowOf[p]; !ok {
			errs = append(errs, fmt.Sprintf("ARCHITECTURE.md: package %s has no row in the package table; imports (of ours): %s", p, sentence(g.imports[p], nil)))
		}
	}
	for i, r := range rows {
		var actual []string
		for _, p := range r.pkgs {
			for _, dep := range g.imports[p] {
				if slices.Contains(r.pkgs, dep) {
					continue // within the row: its packages are one unit
				}
				if !slices.Contains(actual, dep) {
					actual = append(actual, dep)
				}
				if j, ok := rowOf[dep]; ok && j < i {
					errs = append(errs, fmt.Sprintf("ARCHITECTURE.md:%d: %s imports %s, whose row (line %d) is above it: imports point down the table only", r.line, p, dep, rows[j].line))
				}
			}
		}
		if r.unknown {
			continue
		}
		// A `dir/*` claim stands for the packages under dir it matches.
		var claimed []string
		for _, c := range r.claims {
			if dir, ok := strings.CutSuffix(c, "/*"); ok {
				matched := false
				for _, a := range actual {
					if strings.HasPrefix(a, dir+"/") {
						claimed = append(claimed, a)
						matched = true
					}
				}
				if !matched {
					errs = append(errs, fmt.Sprintf("ARCHITECTURE.md:%d: `%s` matches none of the row's imports", r.line, c))
				}
				continue
			}
			claimed = append(claimed, c)
		}
		if d := diff(claimed, actual); d != "" {
			errs = append(errs, fmt.Sprintf("ARCHITECTURE.md:%d: the imports of %s are wrong (%s); the true list is %s", r.line, strings.Join(r.pkgs, ", "), d, sentence(actual, nil)))
		}
	}
	return errs
}

// TestArchTableChecks pins the table checks on a small module, including the
// tables that must fail.
func TestArchTableChecks(t *testing.T) {
	g := &modGraph{
		pkgs: map[string]modPkg{"app": {}, "api/x": {}, "api/y": {}, "lib": {}, "cmd/a": {}},
		imports: map[string][]string{
			"cmd/a": {"app"},
			"app":   {"lib", "api/x", "api/y"},
			"lib":   {"api/x"},
		},
	}
	const head = "# A\n\n## Packages\n\n| Package | Job | Imports (of ours) |\n|---|---|---|\n"
	for _, tc := range []struct {
		name, table string
		wantErrs    int
	}{
		{"true", "| `cmd/a` | main | `app` |\n| `app` | daemon | everything below |\n| `lib` | l | `api/*` |\n| `api/x`, `api/y` | protos | — |\n", 0},
		{"exact lists", "| `cmd/a` | main | `app` |\n| `app` | daemon | `lib`, `api/x`, `api/y` |\n| `lib` | l | `api/x` |\n| `api/x`, `api/y` | protos | — |\n", 0},
		{"missing row", "| `cmd/a` | main | `app` |\n| `app` | daemon | everything below |\n| `api/x`, `api/y` | protos | — |\n", 1},
		{"import up the table", "| `cmd/a` | main | `app` |\n| `lib` | l | `api/x` |\n| `app` | daemon | everything below |\n| `api/x`, `api/y` | protos | — |\n", 1},
		{"stale import", "| `cmd/a` | main | `app`, `lib` |\n| `app` | daemon | everything below |\n| `lib` | l | `api/x` |\n| `api/x`, `api/y` | protos | — |\n", 1},
		{"unknown package and duplicate", "| `cmd/a` | main | `app` |\n| `app`, `gone` | daemon | everything below |\n| `lib` | l | `api/x` |\n| `api/x`, `api/y`, `lib` | protos | — |\n", 2},
		{"wildcard matching nothing", "| `cmd/a` | main | `app`, `other/*` |\n| `app` | daemon | everything below |\n| `lib` | l | `api/x` |\n| `api/x`, `api/y` | protos | — |\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := parseArchTable(head + tc.table + "\n## Next\n\n| `ignored` | x | y |\n")
			if err != nil {
				t.Fatal(err)
			}
			if errs := checkArchTable(g, rows); len(errs) != tc.wantErrs {
				t.Errorf("got %d errors, want %d: %q", len(errs), tc.wantErrs, errs)
			}
		})
	}
	if _, err := parseArchTable("# no table\n"); err == nil {
		t.Error("a page without the table parsed")
	}
}

// TestClaimParsing pins the parsing of the claims on examples, including the
// ones that must fail.
func TestClaimParsing(t *testing.T) {
	g := &modGraph{
		pkgs: map[string]modPkg{"a": {}, "b/c": {}, "d": {}, "e": {}},
		imports: map[string][]string{
			"a": {"b/c", "d"},
		},
		importers: map[string][]string{"a": {"e"}},
		testUsers: map[string][]string{"a": {"d"}},
	}
	for _, tc := range []struct {
		name, doc string
		wantErrs  int
	}{
		{"exact", "Package a does X. Imports (of ours): b/c and d. Imported by: e and tests.", 0},
		{"order and parentheses", "Imports (of ours): d, b/c (for the Y, e.g. Z). Imported by: e (to run it).", 0},
		{"missing import", "Imports (of ours): b/c. Imported by: e.", 1},
		{"extra importer", "Imports (of ours): b/c and d. Imported by: e and d.", 1},
		{"unknown word", "Imports (of ours): b/c, d and the daemon. Imported by: e.", 1},
		{"no sentences", "Package a does X.", 2},
		{"twice", "Imports (of ours): b/c and d. Imports (of ours): b/c and d. Imported by: e.", 1},
		{"nothing is wrong here", "Imports (of ours): nothing of ours. Imported by: nothing.", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if errs := checkDocClaims(g, "a", tc.doc); len(errs) != tc.wantErrs {
				t.Errorf("got %d errors, want %d: %q", len(errs), tc.wantErrs, errs)
			}
		})
	}
	if errs := checkDocClaims(g, "e", "Imports (of ours): nothing of ours. Imported by: tests."); len(errs) != 1 {
		t.Errorf("tests claimed with no test importer: got %q, want one error", errs)
	}
}
