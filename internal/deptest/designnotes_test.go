package deptest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The status rule for design notes (docs/design/*.md), so that a note cannot
// keep saying "proposal" once its code has landed, nor "built" for code that
// was never written or has gone:
//
//   - Each note has exactly one line starting "Status: ", within its first
//     ten lines. Its paragraph (that line and the lines after it up to a
//     blank line) is the status.
//   - The status starts with its state: "proposal", "partly built", "built"
//     or "retired", followed by the end of the line, a period, a comma, a
//     colon or " (".
//   - The status names, in backquotes, at least one exported Go identifier
//     the note is about: the package's path in the module, a dot and the
//     name, and for a member of a type a dot and the member, as in
//     `engine.Engine.StartConn` (a method), `mtls/record.Conn.UseFD`,
//     `hbone.Config.Drive` (a struct field) or `hbone.Driven` (a type); a
//     method named without its type (`engine.StartConn`) does not exist.
//     Other backquoted text (file names such as `conn.go`, environment
//     variables, unexported names) is not an identifier and is not checked.
//   - An identifier exists when the package's non-test Go files declare it:
//     a top-level function, type, variable or constant, a method of a type,
//     a field of a struct type or a method of an interface type.
//   - "built": every named identifier exists. "partly built": some exist and
//     some do not yet. "proposal" and "retired": none exists (a proposal
//     whose identifiers exist has been built: say so; a retired design's
//     have gone).

// designStates are the states a note's status may give.
var designStates = []string{"partly built", "built", "proposal", "retired"}

// identRef matches a backquoted identifier: a package path in the module, a
// dot, an exported name and at most one member.
var identRef = regexp.MustCompile("`([a-z][a-z0-9_]*(?:/[a-z][a-z0-9_]*)*)\\.([A-Z][A-Za-z0-9_]*)(?:\\.([A-Za-z_][A-Za-z0-9_]*))?`")

// noteStatus is a design note's status paragraph, parsed.
type noteStatus struct {
	state string
	// refs are the named identifiers, each "pkg.Name" or "pkg.Type.Member".
	refs []string
}

// parseNoteStatus finds and parses the status of a note's text.
func parseNoteStatus(text string) (noteStatus, error) {
	lines := strings.Split(text, "\n")
	at := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "Status: ") {
			if at >= 0 {
				return noteStatus{}, fmt.Errorf("two status lines (%d and %d)", at+1, i+1)
			}
			at = i
		}
	}
	switch {
	case at < 0:
		return noteStatus{}, fmt.Errorf("no line starting %q", "Status: ")
	case at >= 10:
		return noteStatus{}, fmt.Errorf("the status line is line %d, not within the first ten", at+1)
	}
	var para []string
	for _, l := range lines[at:] {
		if strings.TrimSpace(l) == "" {
			break
		}
		para = append(para, l)
	}
	status := strings.TrimPrefix(strings.Join(para, " "), "Status: ")
	var st noteStatus
	for _, s := range designStates {
		rest, ok := strings.CutPrefix(status, s)
		if ok && (rest == "" || strings.ContainsAny(rest[:1], ".,:") || strings.HasPrefix(rest, " (")) {
			st.state = s
			break
		}
	}
	if st.state == "" {
		return noteStatus{}, fmt.Errorf("status %q does not start with one of %q", firstWords(status), designStates)
	}
	for _, m := range identRef.FindAllStringSubmatch(status, -1) {
		ref := m[1] + "." + m[2]
		if m[3] != "" {
			ref += "." + m[3]
		}
		st.refs = append(st.refs, ref)
	}
	if len(st.refs) == 0 {
		return noteStatus{}, fmt.Errorf("status names no identifier (`pkg.Name` or `pkg.Type.Member`)")
	}
	return st, nil
}

func firstWords(s string) string {
	if f := strings.Fields(s); len(f) > 4 {
		return strings.Join(f[:4], " ") + " ..."
	}
	return s
}

// checkNoteStatus returns what is wrong with st given which of its
// identifiers exist.
func checkNoteStatus(st noteStatus, exists func(ref string) bool) []string {
	var have, missing []string
	for _, r := range st.refs {
		if exists(r) {
			have = append(have, r)
		} else {
			missing = append(missing, r)
		}
	}
	var errs []string
	switch st.state {
	case "built":
		if len(missing) > 0 {
			errs = append(errs, fmt.Sprintf("says built, but %v do not exist", missing))
		}
	case "partly built":
		if len(have) == 0 {
			errs = append(errs, fmt.Sprintf("says partly built, but none of %v exists", missing))
		}
		if len(missing) == 0 {
			errs = append(errs, fmt.Sprintf("says partly built, but all of %v exist: built?", have))
		}
	case "proposal", "retired":
		if len(have) > 0 {
			errs = append(errs, fmt.Sprintf("says %s, but %v exist", st.state, have))
		}
	}
	return errs
}

// declIndex lists what a package's non-test Go files declare, as "Name" and
// "Type.Member", by package path in the module.
type declIndex map[string]map[string]bool

// has reports whether ref ("pkg.Name" or "pkg.Type.Member") is declared.
func (ix declIndex) has(t *testing.T, ref string) bool {
	t.Helper()
	// The package path may contain slashes but no dots, so the first dot
	// after the last slash ends it.
	slash := strings.LastIndex(ref, "/")
	dot := slash + 1 + strings.Index(ref[slash+1:], ".")
	pkg, name := ref[:dot], ref[dot+1:]
	decls, ok := ix[pkg]
	if !ok {
		decls = parseDecls(t, filepath.Join("..", "..", filepath.FromSlash(pkg)))
		ix[pkg] = decls
	}
	return decls[name]
}

// parseDecls returns the declarations of the non-test Go files in dir
// (none when dir holds no Go package).
func parseDecls(t *testing.T, dir string) map[string]bool {
	t.Helper()
	decls := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					decls[d.Name.Name] = true
				} else {
					decls[recvName(d.Recv.List[0].Type)+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						decls[s.Name.Name] = true
						addMembers(decls, s.Name.Name, s.Type)
					case *ast.ValueSpec:
						for _, n := range s.Names {
							decls[n.Name] = true
						}
					}
				}
			}
		}
	}
	return decls
}

// recvName is the type name of a method's receiver (*T, T, T[P]).
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// addMembers records a struct type's fields and an interface type's
// methods as "Type.Member".
func addMembers(decls map[string]bool, typ string, e ast.Expr) {
	var fields *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		fields = x.Fields
	case *ast.InterfaceType:
		fields = x.Methods
	default:
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			decls[typ+"."+n.Name] = true
		}
	}
}

func TestDesignNoteStatus(t *testing.T) {
	notes, err := filepath.Glob(filepath.Join("..", "..", "docs", "design", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) == 0 {
		t.Fatal("no design notes under docs/design: the check would check nothing")
	}
	ix := declIndex{}
	for _, p := range notes {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		name := "docs/design/" + filepath.Base(p)
		st, err := parseNoteStatus(string(text))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, e := range checkNoteStatus(st, func(ref string) bool { return ix.has(t, ref) }) {
			t.Errorf("%s: %s", name, e)
		}
	}
}

// TestDesignNoteRule runs the rule on made-up notes.
func TestDesignNoteRule(t *testing.T) {
	exist := []string{"engine.Engine.StartConn", "hbone.Driven"}
	exists := func(ref string) bool { return slices.Contains(exist, ref) }
	for _, tc := range []struct {
		name, note string
		// wantErr is a substring of the one error, "" for none.
		wantErr string
	}{
		{"built, all exist", "# N\n\nStatus: built. As `engine.Engine.StartConn` and `hbone.Driven`.\n", ""},
		{"built over two lines", "# N\n\nStatus: built (steps 1-6): `engine.Engine.StartConn`,\n`hbone.Driven`.\n\nBody `x.Y`.\n", ""},
		{"built, one missing", "# N\n\nStatus: built: `engine.Engine.StartConn`, `hbone.Gone`.\n", "[hbone.Gone] do not exist"},
		{"identifier after the paragraph is not the status's", "# N\n\nStatus: built: `hbone.Driven`.\n\n`hbone.Gone`\n", ""},
		{"proposal of new code", "# N\n\nStatus: proposal. Would add `hbone.Seam`.\n", ""},
		{"proposal already built", "# N\n\nStatus: proposal, nothing built: `hbone.Driven`.\n", "says proposal, but [hbone.Driven] exist"},
		{"partly built", "# N\n\nStatus: partly built: `hbone.Driven` (not yet `hbone.Seam`).\n", ""},
		{"partly built, all there", "# N\n\nStatus: partly built: `hbone.Driven`.\n", "all of [hbone.Driven] exist"},
		{"retired, gone", "# N\n\nStatus: retired. Was `hbone.OldLoop`.\n", ""},
		{"retired, still there", "# N\n\nStatus: retired. Was `hbone.Driven`.\n", "says retired"},
		{"no identifier", "# N\n\nStatus: proposal, nothing built. Base: main at 1436ed3, `bench/results/x.md`.\n", "names no identifier"},
		{"no status", "# N\n\nSome text.\n", "no line starting"},
		{"two statuses", "# N\n\nStatus: built `hbone.Driven`.\nStatus: proposal `hbone.X`.\n", "two status lines"},
		{"status too late", "# N\n" + strings.Repeat("\n", 10) + "Status: built `hbone.Driven`.\n", "not within the first ten"},
		{"unknown state", "# N\n\nStatus: builtish `hbone.Driven`.\n", "does not start with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errs []string
			st, err := parseNoteStatus(tc.note)
			if err != nil {
				errs = append(errs, err.Error())
			} else {
				errs = checkNoteStatus(st, exists)
			}
			switch {
			case tc.wantErr == "" && len(errs) > 0:
				t.Fatalf("errors %q, want none", errs)
			case tc.wantErr != "" && (len(errs) != 1 || !strings.Contains(errs[0], tc.wantErr)):
				t.Fatalf("errors %q, want one containing %q", errs, tc.wantErr)
			}
		})
	}
}

// TestDeclIndex checks the declaration lookup on this module's own code.
func TestDeclIndex(t *testing.T) {
	ix := declIndex{}
	for ref, want := range map[string]bool{
		"engine.Engine.TakeConn":    true,  // method
		"engine.ConnDriver":         true,  // type
		"engine.ConnDriver.Flush":   true,  // interface method
		"hbone.Config.Drive":        true,  // struct field
		"mtls/record.Conn.UseFD":    true,  // method in a nested package
		"engine.TakeConn":           false, // a method named without its type
		"hbone.NoSuchThing":         false,
		"no/such/package.Anything":  false,
		"engine.Engine.NoSuchField": false,
	} {
		if got := ix.has(t, ref); got != want {
			t.Errorf("has(%s) = %v, want %v", ref, got, want)
		}
	}
}
