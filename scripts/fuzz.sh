#!/usr/bin/env bash
# Runs every go fuzz target of the module, one after the other, each for
# FUZZTIME, then prints a table of executions per target.
#
#   scripts/fuzz.sh [FUZZTIME] [PARALLEL]     (defaults: 10s, GOMAXPROCS workers)
#
# Targets are found by their declarations (func FuzzX(f *testing.F) in a
# _test.go file), which costs no compilation; each package's instrumented
# test binary is built once, by its first target, then comes from the build
# cache. A failing target does not stop the others: go writes the failing
# input under the package's testdata/fuzz/<FuzzName>/ (check it in as the
# regression case once fixed), and the script exits 1 at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

fuzztime=${1:-10s}
parallel=${2:-}
go=${GO:-go}
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

mapfile -t decls < <(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' . | sort)
if [ ${#decls[@]} -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi

# deadline_race reports whether a failed run's log shows only the fuzzing
# coordinator's own deadline error: no failing input, panic or test error.
deadline_race() {
	grep -q 'context deadline exceeded' "$1" &&
		! grep -qE 'Failing input written to|panic:|_test\.go:[0-9]+:' "$1"
}

rows=()
failed=0
start=$SECONDS
for d in "${decls[@]}"; do
	file=${d%%:*}
	name=${d#*:func }
	name=${name%%(*}
	pkg=./$(dirname "${file#./}")
	log="$logdir/${pkg//\//_}_$name.log"
	echo "== $pkg $name ($fuzztime)"
	t0=$SECONDS
	args=(test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime")
	[ -n "$parallel" ] && args+=(-parallel "$parallel")
	"$go" "${args[@]}" "$pkg" >"$log" 2>&1
	rc=$?
	note=
	reruns=0
	while [ $rc -ne 0 ] && [ $reruns -lt 3 ] && deadline_race "$log"; do
		# Go's fuzzing coordinator can report its own -fuzztime deadline as a
		# failure when a worker is mid-call as it fires (golang/go#51484,
		# #75804): no input failed. On a loaded machine it can happen twice
		# in a row (seen in CI), so run the target again, up to three times;
		# any other failure counts at once.
		echo "   (the fuzzing coordinator's deadline race, no failing input: running it again)"
		"$go" "${args[@]}" "$pkg" >"$log" 2>&1
		rc=$?
		reruns=$((reruns + 1))
		note=" (rerun $reruns time(s) after the coordinator's deadline race)"
	done
	secs=$((SECONDS - t0))
	# The last progress line has the totals: "execs: N (R/sec), new
	# interesting: I (total: T)".
	last=$(grep -E '^fuzz: elapsed: .*execs: [0-9]+' "$log" | tail -1)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	corpus=$(sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p' <<<"$last")
	result=ok
	if [ -z "$execs" ]; then
		# FUZZTIME ran out while the engine was still replaying the cached
		# corpus ($GOCACHE/fuzz) to measure its coverage: no new input tried.
		execs=0
		base=$(sed -nE 's/.*gathering baseline coverage: ([0-9]+\/[0-9]+).*/\1/p' "$log" | tail -1)
		result="ok (baseline coverage ${base:-?} only)"
	fi
	if [ $rc -ne 0 ]; then
		result=FAIL
		failed=1
		tail -40 "$log"
		input=$(sed -nE 's/.*Failing input written to (.*)/\1/p' "$log" | tail -1)
		[ -n "$input" ] && result="FAIL ($pkg/$input)"
	fi
	rows+=("$(printf '%-28s %-30s %12s %8s %6ss  %s' "$pkg" "$name" "${execs:-?}" "${corpus:--}" "$secs" "$result$note")")
done

echo
echo "fuzz summary (FUZZTIME=$fuzztime, ${#decls[@]} targets, $((SECONDS - start))s in all)"
printf '%-28s %-30s %12s %8s %7s  %s\n' package target execs corpus time result
for r in "${rows[@]}"; do
	echo "$r"
done
exit $failed
