package istiolab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// A node's filesystem as the programs on it expect it. istio-cni's node
// agent reads and writes fixed paths (/host/opt/cni/bin, /host/etc/cni/net.d,
// /var/run/istio-cni, ...) and its CNI plugin reads /var/run/istio-cni: on a
// cluster those are the node's directories or the agent container's mounts.
// The lab gives each program a root of its own, a directory of the node's
// whose mount points are bind mounts made in a mount namespace of the
// program's (unshare -m, propagation slave: nothing made there shows on the
// host, while the network namespaces the lab adds later still show in it),
// then chroots into it. Nothing is written to the host's own paths.

// bindMount is one mount of a root: Src (a host path) on Dst (a path inside
// the root).
type bindMount struct {
	Src, Dst string
	// ReadOnly remounts the bind read-only: the host's /usr and /etc are
	// lent, not given.
	ReadOnly bool
}

// rootfs is a root directory and what is mounted in it.
type rootfs struct {
	Dir    string
	Mounts []bindMount
	// Procs are where (inside the root) /proc is mounted afresh: the
	// procfs of the PID namespace the program runs in.
	Procs []string
}

// systemMounts are the host's directories a root lends its programs:
// iptables and its libraries for the node agent, devices and the
// network namespace's own /sys; /proc is the root's own (Procs) (`ip netns exec` mounts it). /bin, /sbin and
// /lib* are symbolic links into /usr on a merged-/usr system, and are made
// the same links in the root (prepare) rather than mounts.
func systemMounts() []bindMount {
	return []bindMount{
		{Src: "/usr", Dst: "/usr", ReadOnly: true},
		{Src: "/etc", Dst: "/etc", ReadOnly: true},
		{Src: "/dev", Dst: "/dev"},
		{Src: "/sys", Dst: "/sys"},
	}
}

// prepare makes the root's directories: each mount point, /tmp, /run and
// the top-level links or mount points /bin, /sbin and /lib* take on the
// host.
func (r *rootfs) prepare() error {
	for _, top := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		fi, err := os.Lstat("/" + top)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink("/" + top)
			if err != nil {
				return fmt.Errorf("istiolab: %w", err)
			}
			link := filepath.Join(r.Dir, top)
			if _, err := os.Lstat(link); err == nil {
				continue
			}
			if err := os.Symlink(target, link); err != nil {
				return fmt.Errorf("istiolab: %w", err)
			}
			continue
		}
		r.Mounts = append(r.Mounts, bindMount{Src: "/" + top, Dst: "/" + top, ReadOnly: true})
	}
	for _, d := range []string{"tmp", "run", "var/run"} {
		if err := os.MkdirAll(filepath.Join(r.Dir, d), 0o755); err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
	}
	dirs := slices.Clone(r.Procs)
	for _, m := range r.Mounts {
		dirs = append(dirs, m.Dst)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(r.Dir, d), 0o755); err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
	}
	return nil
}

// command returns a command running bin (a path inside the root) with args
// in network namespace ns, in a mount namespace of its own with the root's
// mounts, chrooted into the root; enter, if not nil, wraps the argv from
// unshare on (nodeHost.enter: the node's PID namespace). The script runs in the host's root until
// the chroot; each mount point exists already (prepare), so it writes
// nothing.
func (r *rootfs) command(ctx context.Context, ns netnslab.NS, enter func(...string) []string, bin string, args ...string) *exec.Cmd {
	var s strings.Builder
	s.WriteString("set -e\n")
	// The root a mount of its own, as a container's is: programs that make
	// their own mounts private (istio-cni's iptables runs) need / to be a
	// mount point.
	fmt.Fprintf(&s, "mount --bind %[1]s %[1]s\n", shellQuote(r.Dir))
	for _, m := range r.Mounts {
		dst := shellQuote(filepath.Join(r.Dir, m.Dst))
		fmt.Fprintf(&s, "mount --rbind %s %s\n", shellQuote(m.Src), dst)
		if m.ReadOnly {
			fmt.Fprintf(&s, "mount -o remount,bind,ro %s\n", dst)
		}
	}
	for _, p := range r.Procs {
		fmt.Fprintf(&s, "mount -t proc proc %s\n", shellQuote(filepath.Join(r.Dir, p)))
	}
	fmt.Fprintf(&s, "exec chroot %s \"$@\"\n", shellQuote(r.Dir))
	// --propagation slave: mounts made here stay here, while the host's
	// new mounts (each network namespace `ip netns add` binds under
	// /run/netns) still reach the root's view of /run/netns.
	argv := append([]string{"unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", s.String(), "sh", bin}, args...)
	if enter != nil {
		argv = enter(argv...)
	}
	return ns.Command(ctx, argv[0], argv[1:]...)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
