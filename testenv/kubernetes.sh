# Sourced by testenv/build.sh, testenv/versions/build.sh and testenv/node/build.sh: the one
# way a Kubernetes release is built here, whatever its version.
#
# build_kubernetes MODULE_DIR OUT_DIR
#   Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd
#   (MODULE_DIR/cmd/etcd, at the version that Kubernetes release pins) from the Go
#   module MODULE_DIR (a go.mod requiring k8s.io/kubernetes with its staging modules
#   replaced by their published versions) into OUT_DIR, stamped as upstream's release
#   builds are: `kubectl version` and the API server's /version say the release.

build_kubernetes() {
  build_kubernetes_commands "$1" "$2" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl \
    ./cmd/etcd
}

# build_kubernetes_commands MODULE_DIR OUT_DIR PACKAGE...
#   Builds the named commands of MODULE_DIR's release with the release's version stamp
#   (testenv/node/build.sh builds the kubelet this way from testenv/k8s).
build_kubernetes_commands() {
  local module="$1" out="$2"
  shift 2
  (
    cd "$module"
    local k8s_version build_date minor pkg cv ldflags
    k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    # The release's publication time on the module proxy, RFC 3339 like upstream's builds.
    build_date="$(go list -m -f '{{.Time.Format "2006-01-02T15:04:05Z07:00"}}' k8s.io/kubernetes)"
    minor="${k8s_version#v1.}"; minor="${minor%%.*}"
    pkg=k8s.io/component-base/version
    ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
    ldflags+=" -X $pkg.gitCommit=module-$k8s_version"
    cv=k8s.io/client-go/pkg/version
    ldflags+=" -X $cv.gitVersion=$k8s_version -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean"
    go build -trimpath -ldflags "$ldflags" -o "$out/" "$@"
  )
}
