package netnslab

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// The numbers of Istio's in-pod capture (scripts/ztunnel-redirect-inpod.sh in ztunnel,
// cni/pkg/iptables in Istio).
const (
	// OutboundPort receives the pod's captured outbound TCP.
	OutboundPort = 15001
	// InboundPlaintextPort receives captured inbound TCP to any port but InboundHBONEPort.
	InboundPlaintextPort = 15006
	// InboundHBONEPort is exempt from inbound capture: the proxy listens on it directly.
	InboundHBONEPort = 15008
	// DNSPort receives captured DNS when CaptureOptions.RedirectDNS is set.
	DNSPort = 15053
	// PacketMark (1337) is the SO_MARK of the proxy's own sockets; marked packets
	// bypass capture. MarkMask selects the bits the rules compare.
	PacketMark = 0x539
	// ConnMark is set on connections the proxy opened towards the pod's app, and
	// restored onto the app's replies so they route back via OrigSrcTable.
	ConnMark = 0x111
	// MarkMask is the mask of every mark comparison.
	MarkMask = 0xfff
	// OrigSrcTable is the routing table that delivers ConnMark-ed replies locally
	// (to the proxy's IP_TRANSPARENT socket); OrigSrcRulePref is its ip rule priority.
	OrigSrcTable    = 100
	OrigSrcRulePref = 32764
)

// ProbeSNATAddr is the address kubelet probes are SNATed from; it is never captured.
var ProbeSNATAddr = netip.MustParseAddr("169.254.7.127")

// ProbeSNATAddr6 is ProbeSNATAddr's IPv6 counterpart (istio-cni's
// ProbeSNATAddress for IPv6).
var ProbeSNATAddr6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")

// ErrCaptureInstalled is returned by InstallCaptureWith when the pod already has
// capture rules installed with different options.
var ErrCaptureInstalled = errors.New("netnslab: capture already installed with other options")

// CaptureOptions selects variants of the in-pod rules. The zero value is what
// InstallCapture installs.
type CaptureOptions struct {
	// RedirectDNS adds the DNS rules: UDP to port 53 (not out lo) and TCP to port 53
	// (not to 127.0.0.1) are redirected to DNSPort, as istio-cni does when DNS
	// capture is on; packets with PacketMark (the proxy's own forwarded queries)
	// are exempt. Off by default.
	RedirectDNS bool
	// IPTablesRestore is the iptables-restore binary to use. Empty means
	// "iptables-restore" (the system's default backend, nft or legacy).
	IPTablesRestore string
	// IPv6 installs the IPv6 rules too (CaptureRules6, CaptureRoutes6), as
	// istio-cni does on a dual-stack node, with the ip6tables-restore that
	// goes with IPTablesRestore. Off by default: lab pods have IPv6
	// addresses only after Pod.EnableIPv6.
	IPv6 bool
}

// InstallCapture installs in the pod's namespace the capture rules Istio's CNI
// installs for in-pod (ambient) mode; see CaptureRules for the exact set. A second
// call with the same options is a no-op.
func (p *Pod) InstallCapture() error { return p.InstallCaptureWith(CaptureOptions{}) }

// InstallCaptureWith is InstallCapture with options.
func (p *Pod) InstallCaptureWith(opts CaptureOptions) error {
	return p.changeLocked(func(l *Lab) error { return p.installCaptureLocked(l, opts) })
}

func (p *Pod) installCaptureLocked(l *Lab, opts CaptureOptions) error {
	if p.Captured {
		if p.capture != opts {
			return fmt.Errorf("%w: pod %s", ErrCaptureInstalled, p.Name)
		}
		return nil
	}
	// The namespace is ours and fresh, but --noflush keeps whatever else a test
	// may have installed before.
	if err := p.restoreIPTables(l, opts, false, CaptureRules(opts)); err != nil {
		return err
	}
	if err := ipBatch(l.logf, p.NetNS, CaptureRoutes()...); err != nil {
		return err
	}
	if opts.IPv6 {
		if err := p.restoreIPTables(l, opts, true, CaptureRules6(opts)); err != nil {
			return err
		}
		if err := ipBatch6(l.logf, p.NetNS, CaptureRoutes6()...); err != nil {
			return err
		}
	}
	p.Captured, p.capture = true, opts
	return nil
}

// RemoveCapture takes the pod's capture rules and routes out again, as
// istio-cni does when a running pod leaves the mesh (DeleteInpodRules before
// it tells ztunnel): afterwards the pod's traffic goes straight to and from its
// apps. A pod without capture is left as it is.
func (p *Pod) RemoveCapture() error { return p.changeLocked(p.removeCaptureLocked) }

func (p *Pod) removeCaptureLocked(l *Lab) error {
	if !p.Captured {
		return nil
	}
	var b strings.Builder
	for _, table := range []string{"mangle", "nat"} {
		fmt.Fprintf(&b, "*%s\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n", table)
		fmt.Fprintf(&b, "-F ISTIO_PRERT\n-F ISTIO_OUTPUT\n-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n")
	}
	if err := p.restoreIPTables(l, p.capture, false, b.String()); err != nil {
		return err
	}
	if err := ipBatch(l.logf, p.NetNS,
		fmt.Sprintf("rule del fwmark 0x%x/0x%x pref %d lookup %d", ConnMark, MarkMask, OrigSrcRulePref, OrigSrcTable),
		fmt.Sprintf("route del local 0.0.0.0/0 dev lo table %d", OrigSrcTable),
	); err != nil {
		return err
	}
	if p.capture.IPv6 {
		if err := p.restoreIPTables(l, p.capture, true, b.String()); err != nil {
			return err
		}
		if err := ipBatch6(l.logf, p.NetNS,
			fmt.Sprintf("rule del fwmark 0x%x/0x%x pref %d lookup %d", ConnMark, MarkMask, OrigSrcRulePref, OrigSrcTable),
			fmt.Sprintf("route del local ::/0 dev lo table %d", OrigSrcTable),
		); err != nil {
			return err
		}
	}
	p.Captured, p.capture = false, CaptureOptions{}
	return nil
}

// restoreIPTables feeds rules to iptables-restore (opts.IPTablesRestore if
// set; its ip6tables sibling for v6) in the pod's namespace, with
// --noflush: rules are added or deleted, never the tables flushed.
func (p *Pod) restoreIPTables(l *Lab, opts CaptureOptions, v6 bool, rules string) error {
	restore := opts.IPTablesRestore
	if restore == "" {
		restore = "iptables-restore"
	}
	if v6 {
		// iptables-restore -> ip6tables-restore,
		// iptables-legacy-restore -> ip6tables-legacy-restore.
		dir, base := "", restore
		if i := strings.LastIndexByte(restore, '/'); i >= 0 {
			dir, base = restore[:i+1], restore[i+1:]
		}
		restore = dir + strings.Replace(base, "iptables", "ip6tables", 1)
	}
	return run(l.logf, rules, "ip", "netns", "exec", p.NetNS, restore, "--noflush", "--wait", "10")
}

// CaptureRules returns the iptables-restore input (IPv4) that InstallCaptureWith
// applies with --noflush.
//
// mangle: PREROUTING marks connections whose packets carry PacketMark (the proxy's
// own connections to the app, looping through lo) with ConnMark; OUTPUT restores
// ConnMark onto the packet mark, so the app's replies to a spoofed (original) source
// are routed by OrigSrcTable back to the proxy's transparent socket.
//
// nat: inbound TCP to any port but InboundHBONEPort goes to InboundPlaintextPort;
// outbound TCP goes to OutboundPort; exempt are ProbeSNATAddr, packets with
// PacketMark, replies with ConnMark, destination 127.0.0.1, and anything else out lo
// (the pod talking to itself).
func CaptureRules(opts CaptureOptions) string {
	return captureRules(opts, "127.0.0.1/32", ProbeSNATAddr.String()+"/32")
}

// CaptureRules6 returns the ip6tables-restore input of the IPv6 capture
// (CaptureOptions.IPv6): CaptureRules with ::1/128 in place of 127.0.0.1/32
// and ProbeSNATAddr6 in place of ProbeSNATAddr, as istio-cni writes them.
// Like Istio's, it exempts only ::1 among the loopback-ish destinations: a
// packet to a v4-mapped ::ffff:127.0.0.1 from the network is redirected to
// InboundPlaintextPort like any other.
func CaptureRules6(opts CaptureOptions) string {
	return captureRules(opts, "::1/128", ProbeSNATAddr6.String()+"/128")
}

func captureRules(opts CaptureOptions, localhost, probe string) string {
	mark := fmt.Sprintf("0x%x/0x%x", PacketMark, MarkMask)
	conn := fmt.Sprintf("0x%x/0x%x", ConnMark, MarkMask)
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*mangle")
	w(":ISTIO_OUTPUT - [0:0]")
	w(":ISTIO_PRERT - [0:0]")
	w("-A PREROUTING -j ISTIO_PRERT")
	w("-A OUTPUT -j ISTIO_OUTPUT")
	w("-A ISTIO_PRERT -m mark --mark %s -j CONNMARK --set-xmark %s", mark, conn)
	w("-A ISTIO_OUTPUT -m connmark --mark %s -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff", conn)
	w("COMMIT")
	w("*nat")
	w(":ISTIO_OUTPUT - [0:0]")
	w(":ISTIO_PRERT - [0:0]")
	w("-A PREROUTING -j ISTIO_PRERT")
	w("-A OUTPUT -j ISTIO_OUTPUT")
	w("-A ISTIO_PRERT -s %s -p tcp -m tcp -j ACCEPT", probe)
	w("-A ISTIO_PRERT ! -d %s -p tcp -m tcp ! --dport %d -m mark ! --mark %s -j REDIRECT --to-ports %d", localhost, InboundHBONEPort, mark, InboundPlaintextPort)
	w("-A ISTIO_OUTPUT -d %s -p tcp -m tcp -j ACCEPT", probe)
	if opts.RedirectDNS {
		w("-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark %s -m udp --dport 53 -j REDIRECT --to-ports %d", mark, DNSPort)
		w("-A ISTIO_OUTPUT ! -d %s -p tcp -m tcp --dport 53 -m mark ! --mark %s -j REDIRECT --to-ports %d", localhost, mark, DNSPort)
	}
	w("-A ISTIO_OUTPUT -p tcp -m mark --mark %s -j ACCEPT", conn)
	w("-A ISTIO_OUTPUT ! -d %s -o lo -j ACCEPT", localhost)
	w("-A ISTIO_OUTPUT ! -d %s -p tcp -m mark ! --mark %s -j REDIRECT --to-ports %d", localhost, mark, OutboundPort)
	w("COMMIT")
	return b.String()
}

// CaptureRoutes returns the `ip` commands (run inside the pod) that deliver
// ConnMark-ed packets locally: the half of original-source support that iptables
// cannot do.
func CaptureRoutes() []string {
	return []string{
		fmt.Sprintf("route add local 0.0.0.0/0 dev lo table %d", OrigSrcTable),
		fmt.Sprintf("rule add fwmark 0x%x/0x%x pref %d lookup %d", ConnMark, MarkMask, OrigSrcRulePref, OrigSrcTable),
	}
}

// CaptureRoutes6 is CaptureRoutes for IPv6 (CaptureOptions.IPv6), to run
// with `ip -6`.
func CaptureRoutes6() []string {
	return []string{
		fmt.Sprintf("route add local ::/0 dev lo table %d", OrigSrcTable),
		fmt.Sprintf("rule add fwmark 0x%x/0x%x pref %d lookup %d", ConnMark, MarkMask, OrigSrcRulePref, OrigSrcTable),
	}
}
