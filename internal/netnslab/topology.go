package netnslab

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// Topology is a plain-data copy of a lab: what zlab prints and stores, and what other
// processes read to find the namespaces. Its Nodes and Pods are detached from any
// live lab: their NS methods (Do, Dial, Command, ...) work, AddPod and
// InstallCapture return ErrNotInLab.
type Topology struct {
	// Prefix is the lab's prefix.
	Prefix string `json:"prefix"`
	// NetNS is the namespace holding the node network's bridge.
	NetNS string `json:"netns"`
	// NodeNetwork is the nodes' network.
	NodeNetwork netip.Prefix `json:"nodeNetwork"`
	// Nodes lists the nodes, each with its pods.
	Nodes []*Node `json:"nodes"`
}

// ParseTopology decodes a Topology written as JSON and links every Pod to its Node.
func ParseTopology(data []byte) (*Topology, error) {
	var t Topology
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("netnslab: parse topology: %w", err)
	}
	for _, n := range t.Nodes {
		if n == nil {
			return nil, fmt.Errorf("netnslab: parse topology: null node")
		}
		for _, p := range n.Pods {
			if p == nil {
				return nil, fmt.Errorf("netnslab: parse topology: null pod on node %q", n.Name)
			}
			p.Node = n
		}
	}
	return &t, nil
}

// Pods lists every pod, node by node.
func (t *Topology) Pods() []*Pod {
	var pods []*Pod
	for _, n := range t.Nodes {
		pods = append(pods, n.Pods...)
	}
	return pods
}

// Lookup finds a node or pod by name and returns its namespace.
func (t *Topology) Lookup(name string) (NS, bool) {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n.NS, true
		}
		for _, p := range n.Pods {
			if p.Name == name {
				return p.NS, true
			}
		}
	}
	return NS{}, false
}
