#!/bin/sh
# Prints the linker flags that stamp ztunnel-go's own version and revision
# into the daemon (its start log, /config_dump, `ztunnel version`). One
# recipe for `make build` and the image (deploy/Dockerfile), so both say the
# same thing:
#   version:  $version if set, else the VERSION file at the repository root
#             (ztunnel-go's release, never Istio's: ISTIO_META_ISTIO_VERSION
#             carries that);
#   revision: $git_revision if set, else the checkout's commit (with
#             "-dirty" when it has uncommitted changes), else "unknown" (an
#             image's build context has no .git: `make image` passes it).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
v=${version:-}
if [ -z "$v" ]; then
	v=$(tr -d ' \n' <"$root/VERSION")
fi
r=${git_revision:-}
if [ -z "$r" ] && r=$(git -C "$root" rev-parse HEAD 2>/dev/null); then
	if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
		r="$r-dirty"
	fi
fi
[ -n "$r" ] || r=unknown
pkg=github.com/ztunnel-go/ztunnel/internal/app
printf '%s\n' "-X $pkg.stampedVersion=$v -X $pkg.stampedRevision=$r"
