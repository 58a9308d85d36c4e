package hbone

import "testing"

// TestStreamHistory: what a server connection remembers of streams no
// longer in its map, and what it forgets first.
func TestStreamHistory(t *testing.T) {
	type note struct {
		id  uint32
		how closedHow
	}
	for _, tc := range []struct {
		name    string
		opened  []uint32 // identifiers the client opens, in order
		notes   []note
		id      uint32
		how     closedHow
		skipped bool
	}{
		{name: "nothing known", opened: []uint32{1, 3}, id: 1},
		{name: "closed both ways", opened: []uint32{1}, notes: []note{{1, closedPeerEnded}}, id: 1, how: closedPeerEnded},
		{name: "flags add up", opened: []uint32{1}, notes: []note{{1, closedLocalReset}, {1, closedPeerReset}},
			id: 1, how: closedLocalReset | closedPeerReset},
		{name: "no flags, no record", opened: []uint32{1}, notes: []note{{1, 0}}, id: 1},
		{name: "first streams skipped", opened: []uint32{5}, id: 3, skipped: true},
		{name: "stream 1 skipped", opened: []uint32{3}, id: 1, skipped: true},
		{name: "opened, not skipped", opened: []uint32{1, 5}, id: 1},
		{name: "gap in the middle", opened: []uint32{1, 3, 11, 13}, id: 7, skipped: true},
		{name: "gap ends below", opened: []uint32{1, 3, 11, 13}, id: 11},
		{name: "even never skipped", opened: []uint32{1, 11}, id: 6},
		{name: "oldest closing forgotten", opened: []uint32{1}, notes: func() []note {
			n := []note{{1, closedPeerEnded}}
			for id := uint32(3); id < 3+2*closedRingLen; id += 2 {
				n = append(n, note{id, closedLocalReset})
			}
			return n
		}(), id: 1},
		{name: "newest closings kept", opened: []uint32{1}, notes: func() []note {
			var n []note
			for id := uint32(3); id < 3+2*closedRingLen; id += 2 {
				n = append(n, note{id, closedLocalReset})
			}
			return n
		}(), id: 3, how: closedLocalReset},
		{name: "oldest skipped range forgotten", opened: func() []uint32 {
			var ids []uint32
			for i := range uint32(skipRingLen + 2) {
				ids = append(ids, 1+4*i) // each skips the one before it
			}
			return ids[1:] // 5, 9, ...: skipRingLen+1 ranges, [1, 3] first
		}(), id: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &conn{}
			for _, id := range tc.opened {
				c.openPeerIDLocked(id)
			}
			for _, n := range tc.notes {
				c.noteClosedLocked(n.id, n.how)
			}
			if got := c.closedHowLocked(tc.id); got != tc.how {
				t.Errorf("closedHowLocked(%d) = %b, want %b", tc.id, got, tc.how)
			}
			if got := c.skippedLocked(tc.id); got != tc.skipped {
				t.Errorf("skippedLocked(%d) = %v, want %v", tc.id, got, tc.skipped)
			}
		})
	}
	t.Run("client keeps none", func(t *testing.T) {
		c := &conn{client: true}
		c.noteClosedLocked(1, closedPeerEnded)
		if c.hist != nil || c.closedHowLocked(1) != 0 {
			t.Error("a client connection keeps a history")
		}
	})
}
