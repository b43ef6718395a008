#!/usr/bin/env bash
# compat.sh - the version matrix: the test bed's smoke test and failover
# scenarios S1 (kill) and S2 (blackhole) on the transport and localproxy paths,
# against each kube-apiserver version in KUBE_VERSIONS (each built once by
# hack/tools/build-kube.sh, a few minutes the first time).
#
#   KUBE_VERSIONS="v1.34.4 v1.35.4 v1.36.3" hack/tools/compat.sh
#
# Prints a table and writes it, with each run's log, to _output/compat/.
# Exits non-zero if any version failed. Not part of make test.
set -uo pipefail
cd "$(dirname "$0")/../.."
versions=${KUBE_VERSIONS:-v1.34.4 v1.35.4 v1.36.3}
out=_output/compat
mkdir -p "$out"
summary=$out/summary.md
log() { echo "compat: $*" >&2; }

printf '| kube-apiserver | build | smoke | S1/S2 transport | S1/S2 localproxy |\n|---|---|---|---|---|\n' >"$summary"
failed=0
for v in $versions; do
  if ! [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    log "KUBE_VERSIONS: $v is not a version vX.Y.Z"; exit 2
  fi
  build=ok smoke=- transport=- localproxy=-
  log "$v: building kube-apiserver and kubectl"
  if ! bash hack/tools/build-kube.sh "$v" >"$out/build-$v.log" 2>&1; then
    build=FAIL failed=1
    log "$v: build failed, see $out/build-$v.log"
  else
    export KUBE_VERSION=$v APIFAILOVER_E2E=1
    log "$v: smoke test"
    if go test -count=1 -timeout 20m -v -run '^TestSmoke$' ./hack/testbed/ >"$out/smoke-$v.log" 2>&1; then smoke=pass; else smoke=FAIL failed=1; fi
    log "$v: S1 and S2 on the transport and localproxy paths"
    go test -count=1 -timeout 30m -v -run '^TestFailover$/^(transport|localproxy)$/^(S1|S2)-' ./hack/e2e/ >"$out/failover-$v.log" 2>&1
    for p in transport localproxy; do
      n_pass=$(grep -cE -- "--- PASS: TestFailover/$p/S[12]-" "$out/failover-$v.log")
      n_fail=$(grep -cE -- "--- FAIL: TestFailover/$p/S[12]-" "$out/failover-$v.log")
      if [[ $n_pass == 2 && $n_fail == 0 ]]; then r=pass; else r="FAIL ($n_pass passed, $n_fail failed)"; failed=1; fi
      printf -v "$p" '%s' "$r"
    done
  fi
  printf '| %s | %s | %s | %s | %s |\n' "$v" "$build" "$smoke" "$transport" "$localproxy" >>"$summary"
  log "$v: build $build, smoke $smoke, transport $transport, localproxy $localproxy"
done
cat "$summary"
exit "$failed"
