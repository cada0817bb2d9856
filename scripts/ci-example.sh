#!/usr/bin/env bash
# How a project's CI can test against mockserve: start it on a free port, wait until it is ready,
# run the tests with its address in the environment, and stop it whatever the tests' outcome.
#
#   scripts/ci-example.sh [TEST COMMAND...]
#
# The test command runs with
#   MOCKSERVE_URL    http://127.0.0.1:PORT         (e.g. for `loadgen --url`)
#   OPENAI_BASE_URL  http://127.0.0.1:PORT/v1      (what OpenAI SDKs read)
#   OPENAI_API_KEY   unused                        (mockserve checks a key only with --api-key)
# and its exit status is the script's. Without a command, a smoke test runs: one chat completion
# and one streamed chat completion with curl.
#
# env: MOCKSERVE       the binary (default: mockserve on PATH, from `cargo install --path mock_server`)
#      MOCKSERVE_ARGS  extra `mockserve serve` flags, split on whitespace, e.g. "--speedup-ratio 10"
#      READY_TIMEOUT   seconds to wait for the server (default 30)
set -euo pipefail

mockserve=${MOCKSERVE:-mockserve}
read -r -a extra_args <<<"${MOCKSERVE_ARGS:-}"
timeout_s=${READY_TIMEOUT:-30}
log=$(mktemp)
pid=
stop() {
  # SIGTERM: mockserve stops accepting, finishes its streams and exits.
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -f "$log"
}
trap stop EXIT

# --port 0: the OS picks a free port; mockserve prints `mockserve listening on http://ADDR`.
"$mockserve" serve --host 127.0.0.1 --port 0 "${extra_args[@]}" >"$log" 2>&1 &
pid=$!

url=
deadline=$((SECONDS + timeout_s))
until [ -n "$url" ]; do
  url=$(sed -n 's/^mockserve listening on //p' "$log")
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "ci-example.sh: mockserve exited during start:" >&2
    cat "$log" >&2
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    echo "ci-example.sh: mockserve printed no address within $timeout_s s" >&2
    exit 1
  fi
  sleep 0.1
done
# Ready when /health answers 200 (--noproxy: never send loopback traffic through a proxy).
until curl -sf --noproxy '*' -o /dev/null "$url/health"; do
  if [ $SECONDS -ge $deadline ]; then
    echo "ci-example.sh: $url/health not ready within $timeout_s s" >&2
    exit 1
  fi
  sleep 0.1
done
echo "mockserve ready on $url (pid $pid)"

export MOCKSERVE_URL=$url OPENAI_BASE_URL=$url/v1 OPENAI_API_KEY=unused
if [ $# -gt 0 ]; then
  "$@"
  exit
fi

# The smoke test: a whole answer of 8 tokens, then a stream that ends with [DONE].
request='{"model":"mock-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":8'
answer=$(curl -sf --noproxy '*' "$OPENAI_BASE_URL/chat/completions" \
  -H 'Content-Type: application/json' -d "$request}")
case $answer in
  *'"completion_tokens":8'*) echo "chat completion: ok" ;;
  *) echo "chat completion: unexpected answer: $answer" >&2; exit 1 ;;
esac
stream=$(curl -sfN --noproxy '*' "$OPENAI_BASE_URL/chat/completions" \
  -H 'Content-Type: application/json' -d "$request,\"stream\":true}")
case $stream in
  *'data: [DONE]') echo "streamed chat completion: ok" ;;
  *) echo "streamed chat completion: unexpected stream: $stream" >&2; exit 1 ;;
esac
