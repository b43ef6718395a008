#!/usr/bin/env bash
# build-image.sh - build the localproxy container image from
# cmd/localproxy/deploy/Containerfile with buildah (no daemon needed), then
# run it: the binary must start on scratch, as user 65534.
#
#   hack/tools/build-image.sh [TAG]      (default localhost/localproxy:dev)
#
# The Containerfile builds in docker.io/library/golang:1.26. Where that
# registry cannot be reached, a stand-in with the same name is made from
# this machine's Go toolchain (/usr/local/go, or `go env GOROOT`), busybox
# and the CA bundle, so the Containerfile itself builds unchanged. Installs
# buildah and busybox-static with apt-get when missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-localhost/localproxy:dev}
base=docker.io/library/golang:1.26
export BUILDAH_ISOLATION=chroot
log() { echo "build-image: $*" >&2; }

missing=()
command -v buildah >/dev/null || missing+=(buildah)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
if ((${#missing[@]})); then
  log "apt-get install -y ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

if buildah inspect --type image "$base" >/dev/null 2>&1; then
  log "using $base from local storage"
elif timeout 60 buildah pull -q "$base" >/dev/null 2>&1; then
  log "pulled $base"
else
  goroot=$(go env GOROOT)
  log "cannot pull $base: making a stand-in from $goroot ($(go version))"
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  mnt=$(buildah mount "$ctr")
  mkdir -p "$mnt/usr/local" "$mnt/bin" "$mnt/etc/ssl/certs" "$mnt/tmp" "$mnt/root"
  cp -a "$goroot" "$mnt/usr/local/go"
  cp /bin/busybox "$mnt/bin/busybox"
  for c in sh ls cat mkdir rm cp; do ln -s busybox "$mnt/bin/$c"; done
  cp /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/"
  chmod 1777 "$mnt/tmp"
  buildah config --env PATH=/usr/local/go/bin:/bin --env HOME=/root --env GOPATH=/go \
    --env GOPROXY="$(go env GOPROXY)" --env GOFLAGS=-buildvcs=false "$ctr"
  buildah unmount "$ctr" >/dev/null
  buildah commit -q "$ctr" "$base" >/dev/null
fi

version=$(git describe --always --dirty 2>/dev/null || echo dev)
log "building $tag (VERSION=$version); the first build downloads the modules, a few minutes"
buildah bud --pull=never -f cmd/localproxy/deploy/Containerfile --build-arg VERSION="$version" -t "$tag" .

log "checking the image"
cfg=$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$tag")
[[ $cfg == "65534:65534 [/localproxy]" ]] || { log "unexpected user/entrypoint: $cfg"; exit 1; }
ctr=$(buildah from -q "$tag")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
out=$(buildah run "$ctr" -- /localproxy --version)
[[ $out == "localproxy $version "* ]] || { log "unexpected --version output: $out"; exit 1; }
log "ok: $tag runs on scratch as 65534: $out ($(buildah images --format '{{.Size}}' "$tag"))"
