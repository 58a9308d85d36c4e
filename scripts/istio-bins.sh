#!/usr/bin/env bash
# Builds the lab's upstream programs (docs/istio-lab.md) from the istiolab/
# module, unmodified, into OUT (default bin/istiolab), and copies the CRDs the
# lab applies out of the same modules' own files:
#
#   scripts/istio-bins.sh [OUT]
#
#   OUT/etcd, kube-apiserver, kubectl        Kubernetes and etcd
#   OUT/kube-controller-manager              Kubernetes' controllers
#   OUT/pilot-discovery                      istiod
#   OUT/install-cni, istio-cni               istio-cni's node agent and CNI plugin
#   OUT/istioctl                             Istio's operator CLI
#   OUT/helm                                 Helm, which renders the charts
#   OUT/crds/istio.yaml, gateway-api.yaml    Istio's CRDs, the Gateway API's
#   OUT/charts/{base,istio-discovery,istio-cni,ztunnel}/
#                                            Istio's charts the lab renders
#   OUT/versions                             what was built, one "name version" a line
#
# Versions come from istiolab/go.mod, so bumping one is a go.mod change.
# Build tags are the ones Istio's own Makefile uses for each binary; the
# version variables are those Kubernetes' and Istio's release builds stamp,
# so clients that check the server's version see a real one.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/istiolab}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root/istiolab"

GO=${GO:-go}
export CGO_ENABLED=0

modver() { "$GO" list -m -f '{{.Version}}' "$1"; }
moddir() { "$GO" list -m -f '{{.Dir}}' "$1"; }

kube=$(modver k8s.io/kubernetes)         # v1.36.3
kube_major=${kube#v}; kube_major=${kube_major%%.*}
kube_minor=${kube#v"$kube_major".}; kube_minor=${kube_minor%%.*}
istio=$(modver istio.io/istio)           # v0.0.0-<date>-<commit>
istio_commit=${istio##*-}
istio_dir=$(moddir istio.io/istio)
istio_release=$(cat "$istio_dir/VERSION")-dev   # as Istio's Makefile names a build of its main branch

kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=$kube_major -X $pkg.gitMinor=$kube_minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean"
done
istio_ldflags="-s -w -X istio.io/istio/pkg/version.buildVersion=$istio_release"
istio_ldflags+=" -X istio.io/istio/pkg/version.buildGitRevision=$istio_commit -X istio.io/istio/pkg/version.buildStatus=Clean"

build() { # tags ldflags packages...
	local tags=$1 ldflags=$2
	shift 2
	echo "go build $*" >&2
	"$GO" build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/" "$@"
}

# Helm as its Makefile stamps a release: its version and commit (the tag's,
# which the module proxy records), and the Kubernetes version its
# capabilities default to, from the client-go it is built with.
helm_ver=$(modver helm.sh/helm/v3)
helm_commit=$("$GO" mod download -json "helm.sh/helm/v3@$helm_ver" | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p')
cgo=$(modver k8s.io/client-go)           # v0.36.3: Kubernetes 1.36
cgo_major=${cgo#v}; cgo_major=$((${cgo_major%%.*} + 1))
cgo_minor=${cgo#v*.}; cgo_minor=${cgo_minor%%.*}
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_ver"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitCommit=$helm_commit -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	helm_ldflags+=" -X $pkg.k8sVersionMajor=$cgo_major -X $pkg.k8sVersionMinor=$cgo_minor"
done

build "" "-s -w" ./cmd/etcd
build "" "$helm_ldflags" helm.sh/helm/v3/cmd/helm
build "" "$kube_ldflags" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
build vtprotobuf,disable_pgv "$istio_ldflags" istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/istioctl/cmd/istioctl
build agent,disable_pgv,grpcnotrace,retrynotrace "$istio_ldflags" istio.io/istio/cni/cmd/install-cni istio.io/istio/cni/cmd/istio-cni

mkdir -p "$out/crds" "$out/charts"
install -m 0644 "$istio_dir/manifests/charts/base/files/crd-all.gen.yaml" "$out/crds/istio.yaml"
gw_dir=$(moddir sigs.k8s.io/gateway-api)
# The experimental channel through its own kustomization, as Istio's tests
# install it (bin/update_crds.sh there): istiod watches its alpha kinds too.
"$out/kubectl" kustomize "$gw_dir/config/crd/experimental" >"$out/crds/gateway-api.yaml"
# The charts Istio's Helm install uses for ambient (base, istiod, cni,
# ztunnel), as the module holds them; the lab renders them with helm template.
for chart in base istio-control/istio-discovery istio-cni ztunnel; do
	name=${chart##*/}
	rm -rf "${out:?}/charts/$name"
	cp -r "$istio_dir/manifests/charts/$chart" "$out/charts/$name"
	chmod -R u+w "$out/charts/$name"
done

{
	echo "etcd $(modver go.etcd.io/etcd/server/v3)"
	echo "kubernetes $kube"
	echo "istio $istio_release $istio"
	echo "gateway-api $(modver sigs.k8s.io/gateway-api)"
	echo "helm $helm_ver"
} >"$out/versions"
