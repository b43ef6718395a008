#!/usr/bin/env bash
# chart.sh - the localproxy Helm chart (cmd/localproxy/deploy/chart) is the
# one source of the DaemonSet manifest: cmd/localproxy/deploy/daemonset.yaml
# is the chart rendered with its default values.
#
#   hack/tools/chart.sh check    helm lint, helm template, and fail if
#                                daemonset.yaml differs from the rendering
#   hack/tools/chart.sh render   rewrite daemonset.yaml from the chart
#
# Helm comes from its Go module, pinned (go run; the first build takes a
# few minutes, later runs seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."
HELM_VERSION=v3.22.0
chart=cmd/localproxy/deploy/chart
manifest=cmd/localproxy/deploy/daemonset.yaml
log() { echo "chart: $*" >&2; }
helm() { go run "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" "$@"; }

render() {
  cat <<'HEAD'
# apifailover localproxy as a DaemonSet: a node-local TCP proxy on
# 127.0.0.1:7445 in front of every kube-apiserver, with discovery of the
# API servers from the kubernetes EndpointSlices (through the proxy itself,
# never the ClusterIP) and health/metrics/status on 127.0.0.1:7446.
#
# Rendered from the Helm chart in cmd/localproxy/deploy/chart with its
# default values (hack/tools/chart.sh render); do not edit by hand. With
# Helm: helm install apifailover-localproxy cmd/localproxy/deploy/chart
#   --namespace kube-system --set endpoints='{10.0.0.11:6443,...}'
#
# Before applying this file: set LOCALPROXY_ENDPOINTS to your API servers
# (used until discovery answers, and as the last resort) and
# LOCALPROXY_TLS_SERVER_NAME to a name in their certificates
# (kubernetes.default.svc works for kubeadm clusters). Then point
# kubeconfigs at https://127.0.0.1:7445 with tls-server-name set to the
# same name (localproxy kubeconfig does it). API servers in the node's
# topology zone (its topology.kubernetes.io/zone label, or
# LOCALPROXY_ZONE) are preferred after the node's own; give the endpoints
# theirs as host:port@zone. The state file is kept on the node, in
# /var/lib/localproxy.
HEAD
  helm template apifailover-localproxy "$chart" --namespace kube-system | sed '/^# Source: /d'
}

case "${1:-}" in
  check)
    log "helm ${HELM_VERSION} lint (the first run builds helm, a few minutes)"
    helm lint --strict "$chart" >&2
    log "helm template, compared with ${manifest}"
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    render >"$tmp"
    if ! diff -u "$manifest" "$tmp" >&2; then
      log "${manifest} differs from the chart's rendering: run hack/tools/chart.sh render"
      exit 1
    fi
    # The chart refuses what must not be deployed.
    if helm template x "$chart" --set image.tag=latest >/dev/null 2>&1; then
      log "the chart rendered image.tag=latest; it must refuse it"; exit 1
    fi
    if helm template x "$chart" --set endpoints=null >/dev/null 2>&1; then
      log "the chart rendered without endpoints; it must refuse that"; exit 1
    fi
    # A static zone and endpoint zones reach the proxy; the state file's
    # path drives the flag, the init container and the mount.
    out=$(helm template x "$chart" --set zone=zone-a --set 'endpoints={10.0.0.1:6443@zone-a,[fd00::1]:6443@zone-b}' --set stateFile.path=/var/lib/lp/s.json)
    for want in 'value: "zone-a"' 'value: "10.0.0.1:6443@zone-a,[fd00::1]:6443@zone-b"' \
        '- --state-file=/var/lib/lp/s.json' 'mountPath: /var/lib/lp' 'path: /var/lib/lp'; do
      if ! grep -qF -- "$want" <<<"$out"; then
        log "the chart rendered with a zone, endpoint zones and another state file lacks: $want"; exit 1
      fi
    done
    if [ "$(grep -cF -- '/var/lib/lp' <<<"$out")" != 5 ]; then
      log "the state file's path is not in the flag, the init container's flag, both mounts and the hostPath"; exit 1
    fi
    if helm template x "$chart" --set zone=-a >/dev/null 2>&1; then
      log "the chart rendered zone=-a; it must refuse a zone that is no label value"; exit 1
    fi
    if helm template x "$chart" --set stateFile.path=/state.json >/dev/null 2>&1; then
      log "the chart rendered stateFile.path=/state.json; it must refuse a state file outside a directory of its own"; exit 1
    fi
    log "ok"
    ;;
  render)
    tmp=$(mktemp)
    render >"$tmp"
    mv "$tmp" "$manifest"
    chmod 644 "$manifest"
    log "wrote ${manifest}"
    ;;
  *) log "usage: $0 check|render"; exit 2 ;;
esac
