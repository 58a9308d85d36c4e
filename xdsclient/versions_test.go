package xdsclient

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestVersionsMatchMap runs random sets, removals and compactions on a
// versions table and on a map, and checks after each that every lookup, the
// count and the listing agree.
func TestVersionsMatchMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var v versions
	model := map[string]string{}
	for step := range 20000 {
		name := "n" + strconv.Itoa(r.IntN(500))
		switch op := r.IntN(10); {
		case op < 5:
			ver := strconv.Itoa(step)
			v.set(name, ver)
			model[name] = ver
		case op < 8:
			v.remove(name)
			delete(model, name)
		default:
			v.compact()
		}
		if got, ok := v.get(name); got != model[name] || ok != hasKey(model, name) {
			t.Fatalf("step %d: get(%q) = %q, %v; want %q", step, name, got, ok, model[name])
		}
		if v.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, v.len(), len(model))
		}
		if step%97 == 0 {
			listed := map[string]string{}
			v.all(func(n, ver string) {
				if _, dup := listed[n]; dup {
					t.Fatalf("step %d: %q listed twice", step, n)
				}
				listed[n] = ver
			})
			if !maps.Equal(listed, model) {
				t.Fatalf("step %d: all lists %d names, want %d", step, len(listed), len(model))
			}
		}
	}
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// TestKnownVersionsMemory: the record of what the client holds costs at
// most 48 B per resource beyond the names' and versions' bytes (issue 36:
// a map[string]string cost ~86 B per resource at 100,000 workloads). The
// names and versions are the client's copies of the response's, which the
// handler keeps too (the xdsconv converter keeps a workload's uid as its
// resource name): their bytes are counted out.
func TestKnownVersionsMemory(t *testing.T) {
	const n = 100_000
	const typeURL = "type.googleapis.com/test"
	value := &anypb.Any{TypeUrl: typeURL}
	r := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: "1"}
	for i := range n {
		r.Resources = append(r.Resources, &discoveryv3.Resource{
			Name: fmt.Sprintf("Kubernetes//Pod/ns-%d/pod-%d", i%1000, i), Version: strconv.Itoa(i), Resource: value,
		})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := New(Config{})
	c.Register(typeURL, HandlerFunc(func(*Update) []Rejection { return nil }))
	if _, ack := c.handle(r); !ack {
		t.Fatal("NACK")
	}
	c.known[typeURL].compact() // as runStream does once the ACK is sent
	runtime.GC()
	runtime.ReadMemStats(&after)
	var copied int
	for _, res := range r.Resources {
		copied += len(res.Name) + len(res.Version)
	}
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)-int64(copied)) / n
	t.Logf("%.1f B per resource beyond the copied bytes (%.1f B)", per, float64(copied)/n)
	if per > 48 {
		t.Errorf("the client's record of versions holds %.1f B per resource, want at most 48", per)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(r)
}

// BenchmarkHandleOneDelta: the client's own cost of one response changing
// one resource while it holds 120,000 (the handler does nothing): the
// update handed over and the record of versions kept.
func BenchmarkHandleOneDelta(b *testing.B) {
	const n = 120_000
	const typeURL = "type.googleapis.com/test"
	value := &anypb.Any{TypeUrl: typeURL}
	full := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: "0"}
	for i := range n {
		full.Resources = append(full.Resources, &discoveryv3.Resource{
			Name: fmt.Sprintf("Kubernetes//Pod/ns-%d/pod-%d", i%1000, i), Version: "1", Resource: value,
		})
	}
	c := New(Config{})
	c.Register(typeURL, HandlerFunc(func(*Update) []Rejection { return nil }))
	c.handle(full)
	c.known[typeURL].compact()
	one := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: "1", Resources: []*discoveryv3.Resource{
		{Name: full.Resources[4242].Name, Version: "2", Resource: value},
	}}
	b.ReportAllocs()
	for b.Loop() {
		if _, ack := c.handle(one); !ack {
			b.Fatal("NACK")
		}
		c.known[typeURL].compact()
	}
}
