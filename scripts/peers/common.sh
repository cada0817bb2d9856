# Sourced by the scripts beside it: where the peer tooling's state lives, and the environment
# every Dynamo process runs in.
#
#   PEERS_HERE  this folder (scripts/peers)
#   ROOT        root of all state: $SERVESIM_PEERS, default .peers/ in the repository root
#   PEERS_PY    the Dynamo venv's interpreter

PEERS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${SERVESIM_PEERS:-$(cd "$PEERS_HERE/../.." && pwd)/.peers}
case $ROOT in /*) ;; *) ROOT=$PWD/$ROOT ;; esac
PEERS_PY=$ROOT/venv/dynamo/bin/python

# HOME and the caches under the root (Dynamo writes model cards to $HOME/.cache/dynamo/mdc); no
# model hub and no telemetry.
peers_isolate() {
  export SERVESIM_PEERS=$ROOT HOME=$ROOT/home XDG_CACHE_HOME=$ROOT/cache
  export HF_HOME=$ROOT/cache/huggingface HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  export HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
}
