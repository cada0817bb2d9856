#!/usr/bin/env bash
# NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`, ai-dynamo 1.6.1), in the
# foreground, from the venv that `scripts/peers/setup.sh dynamo` built. It is the index Dynamo's KV
# router keeps of which worker caches which blocks, without the Dynamo runtime: it subscribes
# (connects) to each worker's ZMQ KV-event publisher and answers HTTP queries
# (`POST /query {"token_ids": [...], "model_name": "default"}` -> overlap scores per worker, in
# tokens; `/register`, `/unregister`, `/query_by_hash`, `/dump`).
#
# usage: scripts/peers/kv_indexer.sh [dynamo.indexer flags]      (--help lists them)
#   e.g. scripts/peers/kv_indexer.sh --workers "0=tcp://127.0.0.1:5557" --block-size 64 --port 8090
# env:   SERVESIM_PEERS  root of all state (default: .peers/ in the repository root)
#        DYN_LOG         Dynamo's log level (default info)
#
# Dynamo 1.6.1 binds the indexer's HTTP port on 0.0.0.0 (all interfaces); it has no host flag.
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ -x "$PEERS_PY" ] || { echo "kv_indexer.sh: no Dynamo venv at $ROOT/venv/dynamo: run scripts/peers/setup.sh dynamo" >&2; exit 1; }
peers_isolate
export DYN_LOG=${DYN_LOG:-info}
exec "$PEERS_PY" -m dynamo.indexer "$@"
