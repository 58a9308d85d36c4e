package netnslab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// GlobalPrefix starts every lab prefix, and so every namespace the lab creates.
// CleanupStale(GlobalPrefix) sweeps the leftovers of every crashed lab.
const GlobalPrefix = "zl-"

// Address plan. Node N: 172.30.0.(N+1) on NodeNetwork, pods in 10.244.N.0/24.
var (
	// NodeNetwork is the network that connects the nodes (the bridge in the lab's
	// "net" namespace).
	NodeNetwork = netip.MustParsePrefix("172.30.0.0/24")
	podSupernet = netip.MustParseAddr("10.244.0.0")
	// podSupernet6 holds the IPv6 pod networks of Pod.EnableIPv6: node N's
	// is fd00:10:244:N::/64.
	podSupernet6 = netip.MustParseAddr("fd00:10:244::")
)

const (
	maxNodes = 250 // node IPs .1-.250, pod CIDRs 10.244.0-249.0/24
	// Pod IPs .2-.254 (.1 is the node's bridge): a node of Kubernetes'
	// 250 pods plus the daemon pods a shared-mode restart adds (issue 36's
	// Node scenario).
	maxPodsPerNode = 253
)

// Sentinel errors.
var (
	// ErrClosed is returned by operations on a closed or detached lab.
	ErrClosed = errors.New("netnslab: lab closed")
	// ErrExists is returned when a node or pod name is already taken in the lab.
	ErrExists = errors.New("netnslab: name already in use")
	// ErrLabBusy is returned when another live process owns a lab with this prefix.
	ErrLabBusy = errors.New("netnslab: lab prefix in use by a live process")
	// ErrLabDetached is returned by NewLab when a detached lab (zlab up) holds the prefix.
	ErrLabDetached = errors.New("netnslab: a detached lab holds this prefix")
	// ErrNotInLab is returned by operations on a Node or Pod copied out of a Topology.
	ErrNotInLab = errors.New("netnslab: not attached to a live lab")
)

var (
	prefixRE = regexp.MustCompile(`^zl-[a-z0-9-]{1,24}$`)
	nameRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)
)

// Config configures a lab. The zero value is not usable: Prefix is required.
type Config struct {
	// Prefix names the lab and starts every namespace name. It must match
	// ^zl-[a-z0-9-]{1,24}$ (so it starts with GlobalPrefix and holds no "_").
	Prefix string
	// Logf, if set, receives every command the lab runs. Nil discards.
	Logf func(format string, args ...any)
}

// Lab is one simulated cluster: a node network, nodes and pods. Its methods are safe
// for concurrent use; topology changes are serialized.
type Lab struct {
	prefix string
	logf   func(format string, args ...any)
	net    NS

	mu       sync.Mutex // guards the following fields, and every Node.Pods and Pod.Captured
	lock     *labLock   // nil once closed or detached
	nodes    []*Node
	byName   map[string]any // *Node or *Pod
	created  []string       // every namespace created, in creation order
	nextNode int
}

// Node is a simulated Kubernetes node: a namespace routing between the node network
// and its pods' bridge.
type Node struct {
	NS
	// Name is the node's name, unique among the lab's nodes and pods.
	Name string `json:"name"`
	// IP is the node's address on NodeNetwork.
	IP netip.Addr `json:"ip"`
	// PodCIDR holds the node's pods; its first address is the pods' gateway.
	PodCIDR netip.Prefix `json:"podCIDR"`
	// Pods lists the node's pods in creation order. AddPod appends to it under the
	// lab's lock: do not read it while another goroutine adds pods (use Lab.Pods).
	Pods []*Pod `json:"pods"`

	lab     *Lab
	index   int
	nextPod int
}

// Pod is a simulated pod: a namespace with one interface on its node's pod bridge.
type Pod struct {
	NS
	// Name is the pod's name, unique among the lab's nodes and pods.
	Name string `json:"name"`
	// IP is the pod's address in its node's PodCIDR.
	IP netip.Addr `json:"ip"`
	// IP6 is the pod's IPv6 address once EnableIPv6 gave it one (invalid
	// before).
	IP6 netip.Addr `json:"ip6,omitzero"`
	// Captured is set by InstallCapture (under the lab's lock).
	Captured bool `json:"captured"`
	// Node is the pod's node (nil in a decoded Topology until ParseTopology links it).
	Node *Node `json:"-"`

	lab     *Lab
	index   int
	capture CaptureOptions
}

// Gateway is the pods' default gateway on this node (the pod bridge's address).
func (n *Node) Gateway() netip.Addr { return n.PodCIDR.Addr().Next() }

// New creates a lab for a test, with a random prefix, and removes it in t.Cleanup.
// It skips the test unless RequireRoot is satisfied, and sweeps stale labs of crashed
// runs first. Errors fail the test.
func New(t testing.TB) *Lab {
	t.Helper()
	RequireRoot(t)
	if _, err := CleanupStale(GlobalPrefix); err != nil {
		t.Logf("netnslab: sweeping stale labs: %v", err)
	}
	l, err := NewLabWith(Config{Prefix: RandomPrefix(), Logf: nil})
	if err != nil {
		t.Fatalf("netnslab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netnslab: close: %v", err)
		}
	})
	return l
}

// RandomPrefix returns a fresh lab prefix: GlobalPrefix and 8 random hex digits.
func RandomPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return GlobalPrefix + hex.EncodeToString(b[:])
}

// NewLab creates an empty lab (the node network only) for non-test use. The caller
// calls Close, or Detach to leave it up. Leftover namespaces of a crashed lab with the
// same prefix are removed first.
func NewLab(prefix string) (*Lab, error) {
	return NewLabWith(Config{Prefix: prefix})
}

// NewLabWith is NewLab with a Config.
func NewLabWith(cfg Config) (l *Lab, err error) {
	if !prefixRE.MatchString(cfg.Prefix) {
		return nil, fmt.Errorf("netnslab: invalid prefix %q: want %s", cfg.Prefix, prefixRE)
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	lock, err := acquireLabLock(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	if lock.detached() {
		lock.release()
		return nil, fmt.Errorf("%w: %s (remove it with `zlab down --prefix %s`)", ErrLabDetached, cfg.Prefix, cfg.Prefix)
	}
	// We hold the lock, so any namespace with our prefix is a crashed run's leftover.
	if err := removeNamespaces(logf, labNamespaces(cfg.Prefix)); err != nil {
		lock.release()
		return nil, err
	}
	l = &Lab{
		prefix: cfg.Prefix,
		logf:   logf,
		net:    NS{NetNS: cfg.Prefix},
		lock:   lock,
		byName: make(map[string]any),
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
			l = nil
		}
	}()
	if err := l.addNetNSLocked(l.net.NetNS); err != nil {
		return l, err
	}
	if err := ipBatch(logf, l.net.NetNS,
		"link set lo up",
		"link add br0 address "+bridgeMAC(0xff)+" type bridge",
		"link set br0 up",
	); err != nil {
		return l, err
	}
	return l, nil
}

// Prefix returns the lab's prefix.
func (l *Lab) Prefix() string { return l.prefix }

// Net returns the "net" namespace that holds the node network's bridge (br0, with a
// port vethN per node): the place for tc/netem on node links.
func (l *Lab) Net() NS { return l.net }

// addNetNSLocked creates a namespace and records it for Close.
func (l *Lab) addNetNSLocked(name string) error {
	if err := run(l.logf, "", "ip", "netns", "add", name); err != nil {
		return err
	}
	l.created = append(l.created, name)
	return nil
}

// dropNetNSLocked deletes a half-built node's or pod's namespace, so that its name can
// be used again; a failure leaves it recorded for Close.
func (l *Lab) dropNetNSLocked(name string) {
	if err := removeNamespaces(l.logf, []string{name}); err != nil {
		l.logf("netnslab: removing half-built %s: %v", name, err)
		return
	}
	l.forgetNetNSLocked(name)
}

func (l *Lab) forgetNetNSLocked(name string) {
	for i, c := range l.created {
		if c == name {
			l.created = append(l.created[:i], l.created[i+1:]...)
			return
		}
	}
}

// netnsName is the namespace name of a node or pod of this lab.
func (l *Lab) netnsName(name string) string { return l.prefix + "_" + name }

func (l *Lab) checkNameLocked(name string) error {
	if l.lock == nil {
		return ErrClosed
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("netnslab: invalid name %q: want %s", name, nameRE)
	}
	if _, ok := l.byName[name]; ok {
		return fmt.Errorf("%w: %q", ErrExists, name)
	}
	return nil
}

// AddNode adds a node, wiring it to the node network and adding routes between its pod
// CIDR and every existing node's.
func (l *Lab) AddNode(name string) (*Node, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkNameLocked(name); err != nil {
		return nil, err
	}
	if l.nextNode >= maxNodes {
		return nil, fmt.Errorf("netnslab: at most %d nodes", maxNodes)
	}
	idx := l.nextNode
	ip4 := NodeNetwork.Addr().As4()
	ip4[3] = byte(idx + 1)
	pod4 := podSupernet.As4()
	pod4[2] = byte(idx)
	n := &Node{
		NS:      NS{NetNS: l.netnsName(name)},
		Name:    name,
		IP:      netip.AddrFrom4(ip4),
		PodCIDR: netip.PrefixFrom(netip.AddrFrom4(pod4), 24),
		lab:     l,
		index:   idx,
	}
	// Consume the index even on failure: a half-built node's addresses stay retired.
	l.nextNode++
	if err := l.addNetNSLocked(n.NetNS); err != nil {
		return nil, err
	}
	built := false
	defer func() {
		if !built {
			l.dropNetNSLocked(n.NetNS)
		}
	}()
	// Before any interface exists, so that they all inherit "default". A new
	// namespace copies the root namespace's IPv4 settings, which may be strict.
	if err := n.Do(func() error {
		return writeSysctls(map[string]string{
			"net/ipv4/ip_forward":              "1",
			"net/ipv4/conf/all/rp_filter":      "0",
			"net/ipv4/conf/default/rp_filter":  "0",
			"net/ipv4/conf/all/send_redirects": "0",
		})
	}); err != nil {
		return nil, err
	}
	veth := fmt.Sprintf("veth%d", idx)
	if err := ipBatch(l.logf, l.net.NetNS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", veth, n.NetNS),
		fmt.Sprintf("link set %s master br0", veth),
		fmt.Sprintf("link set %s up", veth),
	); err != nil {
		return nil, err
	}
	cmds := []string{
		"link set lo up",
		fmt.Sprintf("addr add %s/%d dev eth0", n.IP, NodeNetwork.Bits()),
		"link set eth0 up",
		"link add cbr0 address " + bridgeMAC(idx) + " type bridge",
		fmt.Sprintf("addr add %s/%d dev cbr0", n.Gateway(), n.PodCIDR.Bits()),
		"link set cbr0 up",
	}
	for _, o := range l.nodes {
		cmds = append(cmds, fmt.Sprintf("route add %s via %s dev eth0", o.PodCIDR, o.IP))
	}
	if err := ipBatch(l.logf, n.NetNS, cmds...); err != nil {
		return nil, err
	}
	for _, o := range l.nodes {
		if err := ipBatch(l.logf, o.NetNS, fmt.Sprintf("route add %s via %s dev eth0", n.PodCIDR, n.IP)); err != nil {
			return nil, err
		}
	}
	l.nodes = append(l.nodes, n)
	l.byName[name] = n
	built = true
	return n, nil
}

// bridgeMAC is the fixed address of a lab bridge (idx: the node's index;
// 0xff: br0). Fixed because a Linux bridge without an address of its own
// takes the lowest of its ports' addresses and changes it as ports come and
// go: a pod added or deleted on a node (a daemon pod during an upgrade)
// would then move the pods' gateway to another MAC, and every pod's ARP
// entry for it would point nowhere until the kernel probed it again,
// stalling all traffic through the gateway for seconds.
func bridgeMAC(idx int) string {
	return fmt.Sprintf("02:00:0a:f4:%02x:01", idx&0xff) // locally administered
}

// AddPod adds a pod to the node: a namespace with eth0 on the node's pod bridge, its
// address, loopback and a default route via the node.
func (n *Node) AddPod(name string) (*Pod, error) {
	l := n.lab
	if l == nil {
		return nil, ErrNotInLab
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkNameLocked(name); err != nil {
		return nil, err
	}
	if n.nextPod >= maxPodsPerNode {
		return nil, fmt.Errorf("netnslab: at most %d pods per node", maxPodsPerNode)
	}
	idx := n.nextPod
	ip4 := n.PodCIDR.Addr().As4()
	ip4[3] = byte(idx + 2)
	p := &Pod{
		NS:    NS{NetNS: l.netnsName(name)},
		Name:  name,
		IP:    netip.AddrFrom4(ip4),
		Node:  n,
		lab:   l,
		index: idx,
	}
	n.nextPod++
	if err := l.addNetNSLocked(p.NetNS); err != nil {
		return nil, err
	}
	built := false
	defer func() {
		if !built {
			l.dropNetNSLocked(p.NetNS)
		}
	}()
	// Before any interface exists, so that they all inherit "default". A new
	// namespace copies the root namespace's IPv4 settings, which may be strict.
	if err := p.Do(func() error {
		return writeSysctls(map[string]string{
			"net/ipv4/conf/all/rp_filter":     "0",
			"net/ipv4/conf/default/rp_filter": "0",
		})
	}); err != nil {
		return nil, err
	}
	veth := fmt.Sprintf("veth%d", idx)
	if err := ipBatch(l.logf, n.NetNS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", veth, p.NetNS),
		fmt.Sprintf("link set %s master cbr0", veth),
		fmt.Sprintf("link set %s up", veth),
	); err != nil {
		return nil, err
	}
	if err := ipBatch(l.logf, p.NetNS,
		"link set lo up",
		fmt.Sprintf("addr add %s/%d dev eth0", p.IP, n.PodCIDR.Bits()),
		"link set eth0 up",
		fmt.Sprintf("route add default via %s dev eth0", n.Gateway()),
	); err != nil {
		return nil, err
	}
	n.Pods = append(n.Pods, p)
	l.byName[name] = p
	built = true
	return p, nil
}

// Delete removes the pod's namespace (and with it its veth) from the lab. Sockets
// already open in it keep working until closed; new connections to its IP fail.
func (p *Pod) Delete() error { return p.changeLocked(p.deleteLocked) }

// changeLocked runs change with the pod's lab locked, once it is known that
// the pod is in a lab and the lab is still open: what every change to a
// pod's namespace needs first.
func (p *Pod) changeLocked(change func(l *Lab) error) error {
	l := p.lab
	if l == nil {
		return ErrNotInLab
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lock == nil {
		return ErrClosed
	}
	return change(l)
}

func (p *Pod) deleteLocked(l *Lab) error {
	if l.byName[p.Name] != p {
		return fmt.Errorf("netnslab: pod %q is not in the lab", p.Name)
	}
	if err := removeNamespaces(l.logf, []string{p.NetNS}); err != nil {
		return err
	}
	l.forgetNetNSLocked(p.NetNS)
	delete(l.byName, p.Name)
	pods := p.Node.Pods[:0:0]
	for _, q := range p.Node.Pods {
		if q != p {
			pods = append(pods, q)
		}
	}
	p.Node.Pods = pods
	p.Captured = false // the rules went with the namespace
	return nil
}

// Nodes returns the lab's nodes in creation order.
func (l *Lab) Nodes() []*Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Node(nil), l.nodes...)
}

// Pods returns every pod of the lab, node by node, in creation order.
func (l *Lab) Pods() []*Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	var pods []*Pod
	for _, n := range l.nodes {
		pods = append(pods, n.Pods...)
	}
	return pods
}

// Pod looks a pod up by name.
func (l *Lab) Pod(name string) (*Pod, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.byName[name].(*Pod)
	return p, ok
}

// Node looks a node up by name.
func (l *Lab) Node(name string) (*Node, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.byName[name].(*Node)
	return n, ok
}

// Close deletes every namespace of the lab (veths and bridges go with them) and
// releases its lock. Processes still running inside keep their namespace alive, but
// it is no longer reachable by name. Close after Close or Detach is a no-op.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lock == nil {
		return nil
	}
	// Pods first, the node network last: the reverse of creation.
	names := make([]string, 0, len(l.created))
	for i := len(l.created) - 1; i >= 0; i-- {
		names = append(names, l.created[i])
	}
	err := removeNamespaces(l.logf, names)
	// Whatever is left (a failed deletion) is now a leftover for CleanupStale.
	err = errors.Join(err, l.lock.remove())
	l.lock = nil
	return err
}

// Detach leaves the lab up after this process exits (zlab up): it marks the prefix as
// detached, so CleanupStale leaves it alone, and releases the lock. RemoveLab deletes
// it later. The Lab is unusable afterwards.
func (l *Lab) Detach() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lock == nil {
		return ErrClosed
	}
	err := l.lock.detach()
	l.lock = nil
	return err
}

// Topology returns a deep copy of the lab's nodes and pods, safe to keep, print or
// marshal as JSON.
func (l *Lab) Topology() *Topology {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := &Topology{Prefix: l.prefix, NetNS: l.net.NetNS, NodeNetwork: NodeNetwork}
	for _, n := range l.nodes {
		nc := &Node{NS: n.NS, Name: n.Name, IP: n.IP, PodCIDR: n.PodCIDR}
		for _, p := range n.Pods {
			nc.Pods = append(nc.Pods, &Pod{NS: p.NS, Name: p.Name, IP: p.IP, IP6: p.IP6, Captured: p.Captured, Node: nc})
		}
		t.Nodes = append(t.Nodes, nc)
	}
	return t
}

// String describes the lab for logs.
func (l *Lab) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lab %s:", l.prefix)
	for _, n := range l.Topology().Nodes {
		fmt.Fprintf(&b, " %s(%s)[", n.Name, n.IP)
		for i, p := range n.Pods {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%s", p.Name, p.IP)
		}
		b.WriteByte(']')
	}
	return b.String()
}
