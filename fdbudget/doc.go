// Package fdbudget is the daemon's one budget of file descriptors taken on
// a peer's word, shared by every listener of every proxy, with a per-peer
// fairness rule: one peer (a source IP) cannot take the descriptors the
// daemon and the other peers need, whatever listener it floods.
//
// A unit is one descriptor. The total is what RLIMIT_NOFILE allows minus a
// reserve for the daemon's own needs (NoFileLimit, DefaultReserve). A peer
// holding h units may take n more while the total has room and either
// h+n <= Floor, or h+n is no more than what stays free after the take. A
// lone flooder therefore stops at half the total, k flooders at k/(k+1) of
// it between them, and a peer holding little still gets in: what is free
// never falls to what the biggest holder holds.
//
// Acquire and Release are on every connection's path: the peers are kept in
// 64 shards, each a mutex and a map, and the total is one atomic updated by
// compare-and-swap, so the sum of what is held never exceeds the total even
// while peers of other shards take and give back at once.
//
// A nil *Budget is unlimited: every Acquire succeeds and Release does
// nothing, so code built without a budget needs no special case.
//
// Imports (of ours): nothing of ours. Imported by: dnsproxy, internal/app, proxy and tests.
package fdbudget
