// Package netnslab builds simulated Kubernetes nodes and pods out of Linux network
// namespaces, for end-to-end tests, the demo and the benchmarks.
//
// Its single job is the lab's network: namespaces, veth pairs, bridges, routes and
// the in-pod capture rules that Istio's CNI installs. It starts no daemon; callers run
// their processes or sockets inside a namespace with [NS.Command], [NS.Do],
// [NS.Listen] and [NS.Dial].
//
// Topology (node index N, pod index P on its node):
//
//	<prefix>             "net" namespace: bridge br0, the node network 172.30.0.0/24 (no address of its own)
//	<prefix>_<node>      node N: eth0 = 172.30.0.(N+1)/24 on br0, ip_forward=1,
//	                     pod bridge cbr0 = 10.244.N.1/24, a route to every other node's pod CIDR via that node
//	<prefix>_<pod>       pod P on node N: eth0 = 10.244.N.(P+2)/24 on cbr0, lo up, default route via 10.244.N.1
//
// IPv6 is opt-in per pod ([Pod.EnableIPv6]): fd00:10:244:N::(P+2)/64 on eth0,
// fd00:10:244:N::1 on the node's cbr0 as its gateway; pods of one node reach each
// other over it, nothing routes IPv6 between nodes. [CaptureOptions.IPv6] adds
// istio-cni's IPv6 capture rules (ip6tables).
//
// Every name carries the lab's prefix, which starts with [GlobalPrefix]. Interfaces
// are created directly inside lab namespaces, never in the root namespace, so their
// short fixed names (br0, eth0, cbr0, vethN) cannot collide between labs. Nothing is
// ever configured in the root network namespace: the only host-side effects are the
// namespace mounts under /run/netns and the lock files under [LockDir].
//
// A test that cannot run here for want of root or a tool skips through [Skip]
// ([RequireRoot] and [RequireTool] use it): each skip is appended to the file
// named by NETNSLAB_SKIP_LOG, so that make test can report at the end how many
// did not run and why, and NETNSLAB_REQUIRE=1 (CI) turns the skip into a failure.
//
// A live lab holds an flock on its lock file; [CleanupStale] removes the namespaces of
// labs whose owner died without cleaning up (and that were not [Lab.Detach]ed).
//
// Imports (of ours): inpod/netns. Imported by: bench/harness, cmd/zlab,
// internal/istiolab, internal/labrun (the demo) and tests. Never the daemon: the package imports
// "testing" for [New], [RequireRoot] and [Skip].
package netnslab
