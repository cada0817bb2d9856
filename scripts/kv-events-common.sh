# Shared by the scripts/kv-events-*.sh checks (sourced, not run): a scratch directory `$out`,
# the background processes in `pids` stopped (and `$out` removed) on exit, and `wait_http`.
out=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

wait_http() { # URL: waits up to 60 s for any answer
  for _ in $(seq 1 600); do
    if curl -s -o /dev/null "$1"; then return 0; fi
    sleep 0.1
  done
  echo "no answer from $1" >&2
  return 1
}
