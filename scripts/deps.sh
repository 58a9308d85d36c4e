#!/usr/bin/env bash
# The one list of the system packages the Makefile's targets need, and their
# installer: `make demo`, `make test` and the benchmarks run it first, so on a
# fresh Debian machine the README's commands do the set-up themselves.
#
#   scripts/deps.sh demo|lab|test|bench     (default: test; lab is demo's alias)
#
# A package counts as present when the file it provides (a command, a header)
# is found, so a tool installed some other way is not reinstalled. Run as root
# with apt-get, the script installs what is missing quietly (apt-get update
# only when something is missing) and prints one line naming what it installed;
# otherwise it prints one line saying what to install. It then exits:
#   demo, lab, bench: non-zero when what the lab needs (LAB below) is still missing;
#   test:             zero, because `make test` reports the lab tests that skipped
#                     for want of a tool, and fails on them under NETNSLAB_REQUIRE=1.
set -uo pipefail

mode=${1:-test}

# DEPS: Debian package and the file whose presence shows it is installed.
#   iproute2, iptables: the network-namespace lab (ip, iptables, iptables-restore).
#   nodejs:             the HBONE interop tests against Node's http2 module.
#   make, git:          the Makefile itself, and the build's VCS stamp.
#   ca-certificates:    the Go module proxy over HTTPS.
#   openssl, gnutls-bin, libssl-dev, libgnutls28-dev, gcc, libc6-dev: the TLS
#                       interop tests against OpenSSL and GnuTLS (their CLIs and C
#                       peers, built by the test).
#   util-linux, mount:  unshare and mount, for the upgrade test that runs the
#                       daemons with /proc/sys read-only.
#   haproxy:            one of the proxies the benchmarks compare (TCP, and the mTLS
#                       pair and terminator); its peer configs are tested in make test.
#   nftables:           nft, which istio-cni's native nftables capture runs (the Istio
#                       lab, make test-istio; docs/istio-lab.md).
#   strace:             the benchmarks' round-trip census (make bench-census; perf, if
#                       present (Debian's linux-perf), adds syscall counts by kind and
#                       each proxy's kernel and user CPU per round trip by function).
#   iperf3, python3:    the other clients of zbench --clients (make bench-clients):
#                       iperf3's one stream and a blocking Python RR client.
DEPS=(
	iproute2:ip
	iptables:iptables-restore
	nodejs:node
	make:make
	git:git
	ca-certificates:/etc/ssl/certs/ca-certificates.crt
	openssl:openssl
	gnutls-bin:gnutls-cli
	libssl-dev:/usr/include/openssl/ssl.h
	libgnutls28-dev:/usr/include/gnutls/gnutls.h
	gcc:gcc
	libc6-dev:/usr/include/stdio.h
	util-linux:unshare
	mount:mount
	haproxy:haproxy
	strace:strace
	nftables:nft
	iperf3:iperf3
	python3:python3
)
# LAB: what `make demo` and the benchmarks cannot run without.
LAB=(iproute2 iptables)

want=("${DEPS[@]}")
case "$mode" in
demo | lab | test | bench) ;;
*)
	echo "usage: $0 demo|lab|test|bench" >&2
	exit 2
	;;
esac

# present FILE reports whether FILE (an absolute path, or a command on PATH) exists.
present() {
	case "$1" in
	/*) [ -e "$1" ] ;;
	*) command -v "$1" >/dev/null 2>&1 ;;
	esac
}

missing() {
	local d
	for d in "${want[@]}"; do
		present "${d#*:}" || echo "${d%%:*}"
	done
}

mapfile -t need < <(missing)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$EUID" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	log=$(mktemp)
	trap 'rm -f "$log"' EXIT
	export DEBIAN_FRONTEND=noninteractive
	# The lock timeout lets parallel runs (several worktrees' make test) wait
	# for each other instead of failing on dpkg's lock.
	apt=(apt-get -q -o DPkg::Lock::Timeout=600)
	echo "deps: installing ${need[*]}"
	if "${apt[@]}" update >"$log" 2>&1 &&
		"${apt[@]}" install -y --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
		mapfile -t need < <(missing)
	else
		echo "deps: apt-get failed:" >&2
		tail -n 20 "$log" >&2
	fi
fi

[ ${#need[@]} -eq 0 ] && exit 0

if [ "$EUID" != 0 ]; then
	why="not root"
elif ! command -v apt-get >/dev/null 2>&1; then
	why="no apt-get"
else
	why="apt-get could not install them"
fi
echo "deps: missing ${need[*]} ($why): as root, apt-get install -y ${need[*]}" >&2

if [ "$mode" != test ]; then
	for p in "${need[@]}"; do
		for l in "${LAB[@]}"; do
			[ "$p" = "$l" ] && exit 1
		done
	done
fi
exit 0
