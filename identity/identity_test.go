package identity

import (
	"errors"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Identity
		wantErr bool
	}{
		{name: "valid", in: "spiffe://cluster.local/ns/default/sa/web", want: Identity{"cluster.local", "default", "web"}},
		{name: "other trust domain", in: "spiffe://example.org/ns/a/sa/b", want: Identity{"example.org", "a", "b"}},
		{name: "no scheme", in: "cluster.local/ns/default/sa/web", wantErr: true},
		{name: "http scheme", in: "http://cluster.local/ns/default/sa/web", wantErr: true},
		{name: "too few segments", in: "spiffe://cluster.local/ns/default", wantErr: true},
		{name: "too many segments", in: "spiffe://cluster.local/ns/default/sa/web/x", wantErr: true},
		{name: "wrong keyword", in: "spiffe://cluster.local/namespace/default/sa/web", wantErr: true},
		{name: "trailing slash", in: "spiffe://td/ns/ns/sa/sa/", wantErr: true},
		{name: "keyword in the wrong place", in: "spiffe://td/ns/ns/foobar/sa/", wantErr: true},
		{name: "empty", in: "", wantErr: true},
		// ztunnel's from_str compares the scheme byte for byte.
		{name: "upper-case scheme", in: "SPIFFE://cluster.local/ns/default/sa/web", wantErr: true},
		{name: "mixed-case scheme", in: "Spiffe://cluster.local/ns/default/sa/web", wantErr: true},
		{name: "upper-case keyword", in: "spiffe://cluster.local/NS/default/sa/web", wantErr: true},
		// and accepts empty segments, as its own tests show.
		{name: "empty namespace", in: "spiffe://cluster.local/ns//sa/web", want: Identity{"cluster.local", "", "web"}},
		{name: "empty namespace and service account", in: "spiffe://td/ns//sa/", want: Identity{"td", "", ""}},
		{name: "empty trust domain", in: "spiffe:///ns/a/sa/b", want: Identity{"", "a", "b"}},
		{name: "other characters", in: "spiffe://td.with.dots/ns/a%2Fb?c/sa/d#e", want: Identity{"td.with.dots", "a%2Fb?c", "d#e"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Parse(%q) error = %v, want ErrMalformed", tc.in, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if got.String() != tc.in {
				t.Fatalf("round trip: %q != %q", got.String(), tc.in)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	id := New("", "ns1", "")
	if id.String() != "spiffe://cluster.local/ns/ns1/sa/default" {
		t.Fatalf("got %q", id)
	}
	if id.Principal() != "cluster.local/ns/ns1/sa/default" {
		t.Fatalf("principal %q", id.Principal())
	}
	var zero Identity
	if got, err := Parse("spiffe:///ns//sa/"); err != nil || got != zero {
		t.Fatalf("Parse of the all-empty identity = %+v, %v; want the zero identity", got, err)
	}
	if !zero.IsZero() || zero.String() != "" || zero.Principal() != "" {
		t.Fatal("zero identity must format as empty")
	}
}

func FuzzParse(f *testing.F) {
	fuzzseed.Add(f, "spiffe://cluster.local/ns/default/sa/web")
	fuzzseed.Add(f, "spiffe:///ns//sa/")
	fuzzseed.Add(f, "SPIFFE://cluster.local/ns/default/sa/web")
	fuzzseed.Add(f, "spiffe://td/ns//sa/")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		if id.IsZero() {
			// The one string that parses to "no identity".
			if s != "spiffe:///ns//sa/" {
				t.Fatalf("%q parsed to the zero identity", s)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("%q parsed to %+v, which prints as %q", s, id, id.String())
		}
		again, err := Parse(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip of %q failed: %+v %v", s, again, err)
		}
	})
}
