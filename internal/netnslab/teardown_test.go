package netnslab

// Tests of taking labs down: Close removes everything, and a crashed lab's
// leftovers are found and removed (stale recovery).

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestCloseRemovesEverything(t *testing.T) {
	RequireRoot(t)
	l, err := NewLab(RandomPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n, err := l.AddNode("n")
	if err == nil {
		_, err = n.AddPod("p")
	}
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	p, _ := l.Pod("p")
	if err := p.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Pod("p"); ok || len(n.Pods) != 0 {
		t.Error("deleted pod still listed")
	}
	if got := labNamespaces(l.Prefix()); len(got) != 2 {
		t.Errorf("after pod delete: namespaces %v, want the net and the node", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	assertGone(t, l.Prefix())
	if _, err := l.AddNode("m"); !errors.Is(err, ErrClosed) {
		t.Errorf("AddNode after Close: %v, want ErrClosed", err)
	}
}

// assertGone checks with `ip netns list` that no namespace of the lab is left, and
// that its lock files are gone.
func assertGone(t *testing.T, prefix string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && labOf(f[0]) == prefix {
			t.Errorf("namespace %s left behind", f[0])
		}
	}
	for _, f := range []string{lockPath(prefix), detachedPath(prefix)} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", f, err)
		}
	}
}

// crash builds a lab and abandons it the way a killed process would: its namespaces
// stay, its lock is released by the kernel.
func crash(t *testing.T, prefix string) {
	t.Helper()
	l, err := NewLab(prefix)
	if err != nil {
		t.Fatal(err)
	}
	n, err := l.AddNode("n")
	if err == nil {
		_, err = n.AddPod("p")
	}
	l.lock.f.Close()
	l.lock = nil
	if err != nil {
		t.Fatal(err)
	}
}

func TestStale(t *testing.T) {
	RequireRoot(t)
	stale, sameName, live, detached := RandomPrefix(), RandomPrefix(), RandomPrefix(), RandomPrefix()
	t.Cleanup(func() {
		for _, p := range []string{stale, sameName, live, detached} {
			RemoveLab(p)
		}
	})
	crash(t, stale)
	crash(t, sameName)
	liveLab, err := NewLab(live)
	if err != nil {
		t.Fatal(err)
	}
	defer liveLab.Close()
	if _, err := liveLab.AddNode("n"); err != nil {
		t.Fatal(err)
	}
	d, err := NewLab(detached)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Detach(); err != nil {
		t.Fatal(err)
	}

	// Re-creating a crashed prefix takes it over.
	again, err := NewLab(sameName)
	if err != nil {
		t.Fatal(err)
	}
	if got := labNamespaces(sameName); len(got) != 1 {
		t.Errorf("re-created lab has namespaces %v, want only the node network", got)
	}
	if _, err := NewLab(sameName); !errors.Is(err, ErrLabBusy) {
		t.Errorf("second owner of a live prefix: %v, want ErrLabBusy", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}

	// New sweeps the stale lab, and the new lab works.
	l := newLab(t, 2, 1)
	assertGone(t, stale)
	if got := labNamespaces(live); len(got) != 2 {
		t.Errorf("live lab lost namespaces: %v", got)
	}
	if got := labNamespaces(detached); len(got) != 1 {
		t.Errorf("detached lab lost namespaces: %v", got)
	}
	a, b := mustPod(t, l, "pod0-0"), mustPod(t, l, "pod1-0")
	ch := serveOne(t, listen(t, a.NS, ":7000"))
	roundTrip(t, b.NS, dialer(0, netip.Addr{}), netip.AddrPortFrom(a.IP, 7000), "after sweep")
	await(t, ch, "server")

	// A detached lab blocks NewLab until RemoveLab; a live one blocks RemoveLab.
	if _, err := NewLab(detached); !errors.Is(err, ErrLabDetached) {
		t.Errorf("NewLab on a detached prefix: %v, want ErrLabDetached", err)
	}
	if removed, err := RemoveLab(detached); err != nil || len(removed) != 1 {
		t.Errorf("RemoveLab(detached) = %v, %v", removed, err)
	}
	assertGone(t, detached)
	if _, err := RemoveLab(live); !errors.Is(err, ErrLabBusy) {
		t.Errorf("RemoveLab(live) = %v, want ErrLabBusy", err)
	}
}
