package netnslab

import (
	"fmt"
	"testing"
)

// BenchmarkAddPod measures the cost of one more pod (namespace, veth, addresses,
// routes) in a running lab: the floor under "time to ready" for a new pod.
func BenchmarkAddPod(b *testing.B) {
	l := New(b)
	b.ReportAllocs()
	var n *Node
	for i := range b.N {
		if i%maxPodsPerNode == 0 {
			b.StopTimer()
			var err error
			if n, err = l.AddNode(fmt.Sprintf("node%d", i/maxPodsPerNode)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if _, err := n.AddPod(fmt.Sprintf("pod%d", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDo measures entering and leaving a pod's namespace.
func BenchmarkDo(b *testing.B) {
	l := New(b)
	n, err := l.AddNode("node0")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := n.Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
