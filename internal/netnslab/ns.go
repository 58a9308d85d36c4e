package netnslab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel/inpod/netns"
)

// netnsDir is where iproute2 keeps named network namespaces (bind mounts).
const netnsDir = "/run/netns"

// ErrNoNetNS is returned by the methods of a zero [NS]: running "inside no namespace"
// would run in the root namespace, which the lab never touches.
var ErrNoNetNS = errors.New("netnslab: no network namespace name")

// NS is a named network namespace created by the lab (or any namespace listed by
// `ip netns list`). Node and Pod embed it. Its methods only need the name, so an NS
// decoded from a [Topology] file works as well as a live one.
type NS struct {
	// NetNS is the namespace's name, usable with `ip netns exec` and `ip -n`.
	NetNS string `json:"netns"`
}

// Path is the namespace's bind-mount path, which can be opened to obtain a netns file
// descriptor (for setns, or to hand to a daemon over SCM_RIGHTS as Istio's CNI does).
func (ns NS) Path() string { return netnsDir + "/" + ns.NetNS }

// Open opens the namespace file. The caller closes it.
func (ns NS) Open() (*os.File, error) {
	if ns.NetNS == "" {
		return nil, ErrNoNetNS
	}
	f, err := os.Open(ns.Path())
	if err != nil {
		return nil, fmt.Errorf("netnslab: open netns: %w", err)
	}
	return f, nil
}

// errGoexit reports that fn ended its goroutine (t.FailNow, runtime.Goexit) inside Do.
var errGoexit = netns.ErrGoexit

// Do runs fn on a fresh goroutine locked to its OS thread, with that thread switched
// into the namespace, and waits for it (inpod/netns.Run). Sockets created by fn
// (directly, on that goroutine) belong to the namespace for their whole life, wherever
// they are used later. Goroutines started by fn run on other threads and therefore NOT
// in the namespace. fn must not call t.FailNow; a panic in fn is re-raised in the
// caller.
//
// The thread is switched back to its original namespace afterwards. If that fails the
// thread is deliberately left locked: a goroutine that exits while locked takes its
// thread with it, whereas an unlocked thread stuck in a pod's namespace would go on to
// run unrelated goroutines, which would then silently create their sockets inside the
// pod.
func (ns NS) Do(fn func() error) error {
	target, err := ns.Open()
	if err != nil {
		return err
	}
	defer target.Close()
	return netns.Run(int(target.Fd()), -1, strconv.Quote(ns.NetNS), fn)
}

// Listen creates a listener inside the namespace (see Do).
func (ns NS) Listen(network, addr string) (net.Listener, error) {
	return ns.ListenWith(context.Background(), &net.ListenConfig{}, network, addr)
}

// ListenWith is Listen with a caller's ListenConfig (for Control functions that set
// socket options such as SO_MARK or IP_TRANSPARENT).
func (ns NS) ListenWith(ctx context.Context, lc *net.ListenConfig, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = lc.Listen(ctx, network, addr)
		return err
	})
	return ln, err
}

// ListenPacket creates a packet listener (UDP) inside the namespace (see Do).
func (ns NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := ns.Do(func() error {
		var err error
		pc, err = (&net.ListenConfig{}).ListenPacket(context.Background(), network, addr)
		return err
	})
	return pc, err
}

// Dial connects from inside the namespace, so in a captured pod the connection goes
// through the pod's capture rules. addr must hold an IP literal (or an empty host):
// resolving a name could start goroutines whose sockets would be created outside the
// namespace.
func (ns NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return ns.DialWith(ctx, &net.Dialer{}, network, addr)
}

// DialWith is Dial with a caller's Dialer (LocalAddr, Control for SO_MARK or
// IP_TRANSPARENT, timeouts).
func (ns NS) DialWith(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	if err := requireIPLiteral(network, addr); err != nil {
		return nil, err
	}
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func requireIPLiteral(network, addr string) error {
	if !strings.HasPrefix(network, "tcp") && !strings.HasPrefix(network, "udp") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("netnslab: dial %q: %w", addr, err)
	}
	if host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("netnslab: dial %q: host must be an IP literal inside a namespace", addr)
	}
	return nil
}

// Command returns a command that runs name inside the namespace (`ip netns exec`).
func (ns NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return ExecIn(ctx, ns.NetNS, name, args...)
}

// ExecIn returns a command that runs name inside the named network namespace
// (`ip netns exec <netns> name args...`). An empty netns yields a command that fails
// rather than one that runs in the root namespace.
func ExecIn(ctx context.Context, netnsName, name string, args ...string) *exec.Cmd {
	if netnsName == "" {
		cmd := exec.CommandContext(ctx, "false")
		cmd.Err = ErrNoNetNS
		return cmd
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netnsName, name}, args...)...)
}

// HardwareAddr returns the link-layer (MAC) address of the interface called
// name inside the namespace: what a neighbour on the same link learns by ARP
// or neighbour discovery, for tests that write frames to it directly.
func (ns NS) HardwareAddr(name string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return fmt.Errorf("netnslab: %s in %s: %w", name, ns.NetNS, err)
		}
		mac = ifi.HardwareAddr
		return nil
	})
	return mac, err
}
