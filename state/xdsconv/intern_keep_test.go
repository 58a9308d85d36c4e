package xdsconv

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
)

// TestChangedWorkloadKeepsStrings: a new version of a workload pushed
// after a collection holds the very strings of the version it replaces
// where they are equal (unique's table has forgotten them by then, so
// interning alone would give it fresh copies: issue 36), and its policy
// list too.
func TestChangedWorkloadKeepsStrings(t *testing.T) {
	x, store := newState(t, nil)
	a := benchWorkload(7, "v1")
	applyAddrs(t, x, nil, res(t, a.GetWorkload().GetUid(), a))
	old := store.Load().WorkloadByUID(a.GetWorkload().GetUid())
	runtime.GC()
	runtime.GC()
	b := benchWorkload(7, "v2")
	b.GetWorkload().Status = workloadapi.WorkloadStatus_UNHEALTHY
	applyAddrs(t, x, nil, res(t, b.GetWorkload().GetUid(), b))
	cur := store.Load().WorkloadByUID(a.GetWorkload().GetUid())
	if cur == old || cur.CanonicalRevision != "v2" {
		t.Fatal("the workload was not replaced")
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for _, f := range []struct {
		name     string
		old, cur string
	}{
		{"namespace", old.Namespace, cur.Namespace},
		{"service account", old.ServiceAccount, cur.ServiceAccount},
		{"node", old.Node, cur.Node},
		{"cluster", old.ClusterID, cur.ClusterID},
		{"workload name", old.WorkloadName, cur.WorkloadName},
		{"canonical name", old.CanonicalName, cur.CanonicalName},
	} {
		if !same(f.old, f.cur) {
			t.Errorf("%s: the new version holds another copy of %q", f.name, f.cur)
		}
	}
	if len(cur.AuthorizationPolicies) == 0 || &cur.AuthorizationPolicies[0] != &old.AuthorizationPolicies[0] {
		t.Error("the new version holds another copy of its policy list")
	}
	runtime.KeepAlive(old)
}
