#!/usr/bin/env bash
# Prints, after `make test`, the tests that skipped because the machine lacks
# what they need (root, a lab tool, an interop peer): go test shows a skip only
# with -v, so without this a run on a machine without iptables reports `ok`
# for packages whose lab tests never ran.
#
#   scripts/skips.sh LOG
#
# LOG is the file internal/netnslab's Skip appends to (NETNSLAB_SKIP_LOG), one
# line per skip: directory, test, reason, separated by tabs. Prints nothing
# when LOG is empty. Exits 1 when something skipped and NETNSLAB_REQUIRE is
# set (Skip fails the test itself then; this also catches a test binary that
# skipped without seeing the variable).
set -uo pipefail

log=${1:?usage: $0 LOG}
[ -s "$log" ] || exit 0
root=$(cd "$(dirname "$0")/.." && pwd)

n=$(wc -l <"$log")
bar='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
{
	echo
	echo "$bar"
	echo "!! $n TESTS SKIPPED: this machine cannot run them, so they did NOT run:"
	# Count per reason, then per package, most frequent first.
	cut -f3 "$log" | sort | uniq -c | sort -rn | sed 's/^ *\([0-9]*\) /!!   \1 x /'
	echo "!! in: $(cut -f1 "$log" | sed "s|^$root/||; s|^$root\$|.|" | sort -u | tr '\n' ' ')"
	echo "!! Run make test as root on Debian (it installs the packages), or see scripts/deps.sh."
	[ -n "${NETNSLAB_REQUIRE:-}" ] && echo "!! NETNSLAB_REQUIRE is set: make test fails."
	echo "$bar"
} >&2
[ -z "${NETNSLAB_REQUIRE:-}" ]
