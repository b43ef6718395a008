#!/usr/bin/env bash
# build-image.sh - build the localproxy container image from
# cmd/localproxy/deploy/Containerfile with buildah (no daemon needed), then
# run it: the binary must start on scratch, as user 65534, report its
# version and revision, and answer /healthz.
#
#   hack/tools/build-image.sh [REPOSITORY]   (default ghcr.io/apifailover/localproxy)
#
# The image is tagged REPOSITORY:<release> (the tag the manifests in
# cmd/localproxy/deploy reference; the release is internal/version.Release)
# and REPOSITORY:<release>-<revision> (the git revision, 12 digits, with
# "-dirty" when the tree has uncommitted changes). Never "latest".
#
# The Containerfile builds in docker.io/library/golang:1.26. Where that
# registry cannot be reached, a stand-in with the same name is made from
# this machine's Go toolchain (/usr/local/go, or `go env GOROOT`), busybox
# and the CA bundle, so the Containerfile itself builds unchanged. Installs
# buildah and busybox-static with apt-get when missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=${1:-ghcr.io/apifailover/localproxy}
release=$(sed -n 's/^const Release = "\(.*\)"$/\1/p' internal/version/version.go)
[[ $release =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "build-image: no release version in internal/version/version.go (got '$release')" >&2; exit 1; }
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  revision+=-dirty
fi
tag=$repo:$release
short=${revision:0:12}
[[ $revision != *-dirty ]] || short+=-dirty
revtag=$repo:$release-$short
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

log "building $tag and $revtag (revision $revision); the first build downloads the modules, a few minutes"
buildah bud --pull=never -f cmd/localproxy/deploy/Containerfile \
  --build-arg VERSION="$release" --build-arg REVISION="$revision" -t "$tag" -t "$revtag" .

log "checking the image"
cfg=$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$tag")
[[ $cfg == "65534:65534 [/localproxy]" ]] || { log "unexpected user/entrypoint: $cfg"; exit 1; }
ctr=$(buildah from -q "$tag")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
out=$(buildah run "$ctr" -- /localproxy --version)
[[ $out == "localproxy $release (revision $revision, go"* ]] || { log "unexpected --version output: $out"; exit 1; }
log "$out"

# Start it as a node would (the host's network, ports off the defaults so a
# localproxy already on this machine is not disturbed) and ask /healthz.
port=$((17000 + RANDOM % 2000))
log "starting the image: localproxy on 127.0.0.1:$port, health on 127.0.0.1:$((port + 1))"
buildah run --network=host "$ctr" -- /localproxy --endpoints=127.0.0.1:1 \
  --bind-port="$port" --health-port="$((port + 1))" --probe=tcp >"${TMPDIR:-/tmp}/build-image-run.log" 2>&1 &
run=$!
trap 'kill "$run" 2>/dev/null || true; wait "$run" 2>/dev/null || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
healthz=
for _ in $(seq 100); do
  healthz=$(curl -fsS --max-time 1 "http://127.0.0.1:$((port + 1))/healthz" 2>/dev/null) && break
  kill -0 "$run" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $healthz ]]; then
  log "the image's localproxy did not answer /healthz; its output:"
  cat "${TMPDIR:-/tmp}/build-image-run.log" >&2
  exit 1
fi
log "ok: $tag ($revtag) runs on scratch as 65534 and answers /healthz: $healthz ($(buildah images --format '{{.Size}}' "$tag" | head -1))"
