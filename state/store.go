package state

import "sync/atomic"

// Store publishes snapshots: one writer calls Publish, any number of readers
// call Load without locking. The zero Store is not usable; use NewStore.
type Store struct {
	snap    atomic.Pointer[Snapshot]
	changed atomic.Pointer[chan struct{}]
}

// NewStore returns a store holding initial (Empty() if nil).
func NewStore(initial *Snapshot) *Store {
	if initial == nil {
		initial = Empty()
	}
	st := &Store{}
	st.snap.Store(initial)
	ch := make(chan struct{})
	st.changed.Store(&ch)
	return st
}

// Load returns the current snapshot. Callers load once per connection and
// keep the pointer, so one connection sees one consistent view.
func (st *Store) Load() *Snapshot { return st.snap.Load() }

// Publish makes s the current snapshot and wakes every Changed waiter.
// A nil s publishes Empty().
func (st *Store) Publish(s *Snapshot) {
	if s == nil {
		s = Empty()
	}
	// Store before waking, so that a woken waiter's Load sees s.
	st.snap.Store(s)
	ch := make(chan struct{})
	close(*st.changed.Swap(&ch))
}

// Changed returns a channel that is closed by the next Publish. To wait for a
// condition without missing an update, take the channel first, then Load and
// check, then wait:
//
//	for {
//		ch := st.Changed()
//		if w := st.Load().WorkloadByUID(uid); w != nil {
//			return w
//		}
//		select {
//		case <-ch:
//		case <-ctx.Done():
//			return nil
//		}
//	}
func (st *Store) Changed() <-chan struct{} { return *st.changed.Load() }
