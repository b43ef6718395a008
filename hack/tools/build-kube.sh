#!/usr/bin/env bash
# build-kube.sh [VERSION] - build kube-apiserver and kubectl from the Go
# module proxy into a per-user cache and print the bin directory.
#
# VERSION defaults to $KUBE_VERSION, then v1.36.3. Any released
# k8s.io/kubernetes version the proxy serves works (v1.34.x, v1.35.x, ...).
#
# Method: a throwaway module requires k8s.io/kubernetes vX.Y.Z and replaces
# every k8s.io/<staging> module with v0.Y.Z (the list comes from the replace
# block of that version's go.mod), then `go build` the two commands with the
# version stamped in through -ldflags. Skipped when both binaries exist.
#
# Output: the last line on stdout is the bin directory; progress goes to
# stderr.
set -euo pipefail

version="${1:-${KUBE_VERSION:-v1.36.3}}"
if [[ ! "${version}" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build-kube: version must look like v1.36.3, got ${version}" >&2
  exit 2
fi
major="${BASH_REMATCH[1]}"
minor="${BASH_REMATCH[2]}"
patch="${BASH_REMATCH[3]}"
staging_version="v0.${minor}.${patch}"

cache_root="${XDG_CACHE_HOME:-${HOME}/.cache}/apifailover/kube/${version}"
bin_dir="${cache_root}/bin"
binaries=(kube-apiserver kubectl)

log() { echo "build-kube: $*" >&2; }

all_built() {
  local b
  for b in "${binaries[@]}"; do
    [[ -x "${bin_dir}/${b}" ]] || return 1
  done
}

if all_built; then
  log "${version} already built in ${bin_dir}"
  echo "${bin_dir}"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go not found in PATH"; exit 1; }

mkdir -p "${bin_dir}"
# One build per version at a time (tests may call this concurrently).
exec 9>"${cache_root}/.lock"
if command -v flock >/dev/null 2>&1; then
  log "waiting for lock ${cache_root}/.lock"
  flock 9
fi
if all_built; then
  log "${version} already built in ${bin_dir}"
  echo "${bin_dir}"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/apifailover-kube-build.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

export GOFLAGS="-mod=mod -buildvcs=false"
export GOWORK=off
export CGO_ENABLED="${CGO_ENABLED:-0}"

start=${SECONDS}
log "downloading k8s.io/kubernetes@${version} go.mod"
modfile_json="$(cd "${work}" && go mod download -json "k8s.io/kubernetes@${version}")" || {
  log "go mod download k8s.io/kubernetes@${version} failed"; exit 1; }
gomod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/${version}.mod"
if [[ ! -f "${gomod}" ]]; then
  gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"${modfile_json}")"
fi
[[ -f "${gomod}" ]] || { log "cannot find go.mod of k8s.io/kubernetes@${version}"; exit 1; }

# Staging modules: the targets of `k8s.io/foo => ./staging/src/k8s.io/foo`
# in the replace block (single-line or block form).
mapfile -t staging < <(
  awk '
    /^replace[[:space:]]*\(/ { inblock = 1; next }
    inblock && /^\)/ { inblock = 0; next }
    inblock { print; next }
    /^replace[[:space:]]/ { sub(/^replace[[:space:]]+/, ""); print }
  ' "${gomod}" |
    awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' | sort -u
)
if [[ ${#staging[@]} -eq 0 ]]; then
  log "no staging replace directives found in ${gomod}"
  exit 1
fi
log "${#staging[@]} staging modules pinned to ${staging_version}"

go_line="$(awk '/^go [0-9]/ { print; exit }' "${gomod}")"
{
  echo "module apifailover.test/kubebuild"
  echo
  echo "${go_line:-go 1.24}"
  echo
  echo "require k8s.io/kubernetes ${version}"
  echo
  echo "replace ("
  for m in "${staging[@]}"; do
    echo "	${m} => ${m} ${staging_version}"
  done
  echo ")"
} >"${work}/go.mod"
cat >"${work}/tools.go" <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO

log "resolving module graph (first run downloads ~1.3 GB, several minutes)"
(cd "${work}" && go mod tidy >&2) || {
  log "go mod tidy failed"; exit 1; }

ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${version}"
  ldflags+=" -X ${pkg}.gitMajor=${major}"
  ldflags+=" -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean"
done
ldflags+=" -s -w"

for b in "${binaries[@]}"; do
  log "building ${b} ${version} (elapsed $((SECONDS - start))s)"
  (cd "${work}" && go build -trimpath -ldflags "${ldflags}" \
    -o "${bin_dir}/${b}.tmp" "k8s.io/kubernetes/cmd/${b}" >&2) || {
    log "go build ${b} failed"; exit 1; }
  mv -f "${bin_dir}/${b}.tmp" "${bin_dir}/${b}"
done

log "done in $((SECONDS - start))s"
"${bin_dir}/kube-apiserver" --version >&2 || true
echo "${bin_dir}"
