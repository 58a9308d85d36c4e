package state

import (
	"context"
	"sync"
	"testing"
)

func TestStorePublish(t *testing.T) {
	st := NewStore(nil)
	if st.Load() == nil || len(st.Load().Workloads()) != 0 {
		t.Fatal("NewStore(nil) must hold an empty snapshot")
	}
	ch := st.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any Publish")
	default:
	}
	next := mustSnapshot(t, []*Workload{wl("a", "ns", "a", "10.0.0.1")}, nil, nil)
	st.Publish(next)
	select {
	case <-ch:
	default:
		t.Fatal("Publish did not close the Changed channel")
	}
	if st.Load() != next {
		t.Fatal("Load does not return the published snapshot")
	}
	if st.Changed() == ch {
		t.Fatal("Changed was not replaced")
	}
	st.Publish(nil)
	if st.Load() == nil || st.Load().WorkloadByUID("a") != nil {
		t.Fatal("Publish(nil) must publish an empty snapshot")
	}
}

// TestStoreWait runs the documented wait pattern against a concurrent writer.
func TestStoreWait(t *testing.T) {
	st := NewStore(nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	found := make(chan *Workload, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ch := st.Changed()
			if w := st.Load().WorkloadByUID("target"); w != nil {
				found <- w
				return
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	for i := range 50 {
		ws := []*Workload{wl("other", "ns", "o", "10.0.0.1")}
		if i == 49 {
			ws = append(ws, wl("target", "ns", "t", "10.0.0.2"))
		}
		st.Publish(mustSnapshot(t, ws, nil, nil))
	}
	wg.Wait()
	if w := <-found; w.UID != "target" {
		t.Fatalf("found %v", w)
	}
}

func TestStoreConcurrentReaders(t *testing.T) {
	st := NewStore(nil)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ch := st.Changed()
				_ = st.Load().WorkloadByUID("a")
				select {
				case <-stop:
					return
				case <-ch:
				}
			}
		}()
	}
	for range 100 {
		st.Publish(Empty())
	}
	close(stop)
	wg.Wait()
}
