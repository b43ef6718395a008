#!/usr/bin/env bash
# ensure-deps.sh - install the OS packages the test bed needs (Debian/Ubuntu).
#
#   etcd-server  /usr/bin/etcd, the apiservers' storage (3.4+ works)
#   iptables     blackhole / reset faults
#   iproute2     `ip` to configure the private network namespace, `tc` to
#                shape the benchmark's link
#   openssl      handy for inspecting the generated certificates
#   util-linux   `unshare` for the private network namespace, `flock`,
#                `nsenter` for the benchmark's link
#   haproxy      HAProxy (Debian 12: 2.6): the external load balancer whose
#                backends localproxy's export rewrites in the e2e suite, and
#                a peer of the benchmark
#   systemd      the e2e suite runs the shipped units under a systemd of its
#                own (PID 1 of private PID and mount namespaces)
#
# With --bench it also installs the other peer of the benchmark in hack/bench,
# the localhost load balancers kubespray puts on worker nodes:
#
#   nginx                nginx (Debian 12: 1.22)
#   libnginx-mod-stream  nginx's stream (TCP proxy) module, a dynamic module
#
# Their packaged services are blocked from starting like etcd's.
#
# Idempotent: does nothing when every command is present. Installing needs
# root; as another user it names the missing packages and fails. The Debian
# etcd service is never left running: service starts are blocked during the
# install through policy-rc.d and the unit is stopped and disabled afterwards.
set -euo pipefail

log() { echo "ensure-deps: $*" >&2; }

bench=0
for arg in "$@"; do
  case "${arg}" in
    --bench) bench=1 ;;
    *) log "unknown argument ${arg} (allowed: --bench)"; exit 2 ;;
  esac
done

# command -> package
declare -A want=(
  [etcd]=etcd-server
  [iptables]=iptables
  [ip]=iproute2
  [tc]=iproute2
  [openssl]=openssl
  [unshare]=util-linux
  [flock]=util-linux
  [nsenter]=util-linux
  [haproxy]=haproxy
  [systemctl]=systemd
  [journalctl]=systemd
)
if [[ ${bench} -eq 1 ]]; then
  want[nginx]=nginx
fi

export PATH="${PATH}:/usr/sbin:/sbin"
missing=()
for cmd in "${!want[@]}"; do
  if ! command -v "${cmd}" >/dev/null 2>&1; then
    missing+=("${want[${cmd}]}")
  fi
done
# The stream module is no command: look for the module file.
if [[ ${bench} -eq 1 ]] && ! compgen -G '/usr/lib/nginx/modules/ngx_stream_module.so' >/dev/null; then
  missing+=(libnginx-mod-stream)
fi
versions() {
  local v
  v="etcd $(etcd --version 2>/dev/null | awk '/etcd Version/ {print $3}')"
  if [[ ${bench} -eq 1 ]]; then
    v+=", $(haproxy -v 2>/dev/null | head -n1 | awk '{print $1, $3}')"
    v+=", $(nginx -v 2>&1 | sed 's/^nginx version: //')"
  fi
  echo "${v}"
}
if [[ ${#missing[@]} -eq 0 ]]; then
  log "all prerequisites present ($(versions))"
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [[ "$(id -u)" -ne 0 ]]; then
  log "missing packages: ${missing[*]}"
  log "run as root: apt-get update && apt-get install -y ${missing[*]}"
  log "(or: sudo $0)"
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  log "missing packages: ${missing[*]}; no apt-get on this system, install them by hand"
  exit 1
fi

# Block service starts from maintainer scripts (invoke-rc.d honours
# policy-rc.d exit code 101) so the packaged etcd does not start.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "${policy}" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"${policy}"
  chmod +x "${policy}"
  created_policy=1
fi
cleanup() {
  if [[ ${created_policy} -eq 1 ]]; then rm -f "${policy}"; fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
export RUNLEVEL=1
# Several test binaries may get here at once: wait for apt's lock.
apt_wait=(-o DPkg::Lock::Timeout=600)
log "apt-get update"
apt-get "${apt_wait[@]}" update -q >&2
log "apt-get install -y ${missing[*]}"
apt-get "${apt_wait[@]}" install -y -q --no-install-recommends "${missing[@]}" >&2

# Belt and braces: make sure no packaged etcd is running or enabled.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  systemctl stop etcd.service >/dev/null 2>&1 || true
  systemctl disable etcd.service >/dev/null 2>&1 || true
elif command -v service >/dev/null 2>&1; then
  service etcd stop >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1; then
  update-rc.d etcd disable >/dev/null 2>&1 || true
fi
if pids="$(pgrep -x etcd -u etcd 2>/dev/null)"; then
  log "stopping packaged etcd (pids ${pids//$'\n'/ })"
  # shellcheck disable=SC2086
  kill ${pids} 2>/dev/null || true
fi
# The same for the load balancers: the tests and the benchmark run their own
# instances.
svcs=(haproxy)
[[ ${bench} -eq 0 ]] || svcs+=(nginx)
for svc in "${svcs[@]}"; do
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl stop "${svc}.service" >/dev/null 2>&1 || true
    systemctl disable "${svc}.service" >/dev/null 2>&1 || true
  elif command -v service >/dev/null 2>&1; then
    service "${svc}" stop >/dev/null 2>&1 || true
  fi
  if command -v update-rc.d >/dev/null 2>&1; then
    update-rc.d "${svc}" disable >/dev/null 2>&1 || true
  fi
done
log "done ($(versions))"
