package engine

import (
	"errors"
	"slices"
	"testing"
)

// recordingOwner is a relay owner that records the aborts it is given.
type recordingOwner struct{ causes []error }

func (o *recordingOwner) abort(cause error) { o.causes = append(o.causes, cause) }

// TestSessionAbortBeforeOwner: an abort that comes before the relay has an
// owner is kept and passed on when the owner is set (the first cause
// stands); one that comes after goes straight to the owner.
func TestSessionAbortBeforeOwner(t *testing.T) {
	first, second := errors.New("first"), errors.New("second")
	for _, tc := range []struct {
		name   string
		before []error // aborts before setOwner
		after  []error // aborts after setOwner
		want   []error // what the owner is told, in order
	}{
		{"no abort", nil, nil, nil},
		{"abort before the owner", []error{first}, nil, []error{first}},
		{"two aborts before the owner: the first stands", []error{first, second}, nil, []error{first}},
		{"abort after the owner", nil, []error{second}, []error{second}},
		{"before and after", []error{first}, []error{second}, []error{first, second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &session{}
			for _, c := range tc.before {
				s.abort(c)
			}
			o := &recordingOwner{}
			s.setOwner(o)
			for _, c := range tc.after {
				s.abort(c)
			}
			if !slices.Equal(o.causes, tc.want) {
				t.Fatalf("owner told %v, want %v", o.causes, tc.want)
			}
		})
	}
}
