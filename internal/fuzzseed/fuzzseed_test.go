package fuzzseed

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMarshal pins the corpus format to what go's fuzzing engine writes
// (internal/fuzz marshalCorpusFile), so the files read back as the same
// values.
func TestMarshal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []any
		want    string
		wantErr bool
	}{
		{name: "bytes", args: []any{[]byte("a\x00\"b")}, want: "go test fuzz v1\n[]byte(\"a\\x00\\\"b\")\n"},
		{name: "nil bytes", args: []any{[]byte(nil)}, want: "go test fuzz v1\n[]byte(\"\")\n"},
		{name: "string", args: []any{"spiffe://td/ns/a/sa/b\n"}, want: "go test fuzz v1\nstring(\"spiffe://td/ns/a/sa/b\\n\")\n"},
		{name: "byte", args: []any{uint8(3)}, want: "go test fuzz v1\nbyte('\\x03')\n"},
		{name: "several", args: []any{[]byte{1}, "x", uint16(7), true}, want: "go test fuzz v1\n[]byte(\"\\x01\")\nstring(\"x\")\nuint16(7)\nbool(true)\n"},
		{name: "unsupported", args: []any{3.5}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Marshal(tc.args...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
