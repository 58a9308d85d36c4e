package labrun

import (
	"os/exec"
)

// readOnlyProcSys makes cmd run in a mount namespace of its own in which
// /proc/sys is a read-only bind mount, as Kubernetes mounts it in a
// non-privileged container (the daemon can then write no sysctl, in any
// network namespace). The lab itself, which writes sysctls, is not
// affected. It needs util-linux's unshare and mount.
func readOnlyProcSys(cmd *exec.Cmd) {
	const script = `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"`
	path, err := exec.LookPath("unshare")
	if err != nil {
		cmd.Err = err
		return
	}
	cmd.Args = append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"}, cmd.Args...)
	cmd.Path = path
}
