#!/usr/bin/env bash
# Installs the reference tooling used to compare servesim against NVIDIA Dynamo, all of it under
# one root directory: virtualenvs with exact pins and a hub-free tokenizer directory.
# Safe to re-run: finished steps are checked and skipped.
#
# usage: scripts/peers/setup.sh [all | tokenizer | openai | dynamo | routers | aisimulate]...
#        (default: all = openai dynamo tokenizer routers; aisimulate, 1.5 GB, is installed only
#        when named)
# env:   SERVESIM_PEERS  root of all state (default: .peers/ in the repository root, git-ignored)
#        PYTHON          interpreter for the venvs (default: python3.11, else python3; >= 3.11)
#        SETUP_MODE      lock (default: install locks/<venv>.txt with pip --no-deps)
#                        | resolve (let pip resolve from the top-level pins instead)
#
# Layout under the root:
#   venv/openai/               openai 3.57.0, the OpenAI Python SDK for client checks
#   venv/dynamo/               ai-dynamo 1.6.1 + ai-dynamo-runtime 1.6.1 (frontend, mocker,
#                              offline replay, standalone KV indexer)
#   venv/routers/              vllm-router 0.1.17 and sglang-router 0.3.2 (wheels only), the real
#                              routers scripts/router-bench.sh puts in front of a mockserve fleet
#   venv/aisimulate/           aisimulate 0.13.0.dev202610270000000085 (wheels only): NVIDIA's
#                              simulator, the reference for agentic trace replay
#                              (scripts/compare-aisimulate.sh); no GPU, no network at run time
#   tokenizer/deepseek-v3-tok/ DeepSeek-V3 tokenizer.json (MIT, from the litellm wheel) + config
#   home/ cache/               HOME, pip cache and HF cache for everything these scripts run
#   run/                       PID files and logs of run_dynamo.sh
#   scratch/                   short-lived downloads during setup
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MODE=${SETUP_MODE:-lock}
PIP_PIN=pip==26.3
LITELLM_PIN=litellm==1.110.2
TOKENIZER_SHA256=4607b3d1929c5ca263a81d7153c6d6ecdbc71c9e933c0fb2df2abf181bf6df61
REAL_HOME=$HOME

die() { echo "setup.sh: $*" >&2; exit 1; }
case $MODE in lock | resolve) ;; *) die "SETUP_MODE must be lock or resolve, not '$MODE'" ;; esac
targets=()
for t in "${@:-all}"; do
  case $t in
    all) targets+=(openai dynamo tokenizer routers) ;;
    tokenizer | openai | dynamo | routers | aisimulate) targets+=("$t") ;;
    *) die "unknown step '$t' (all | tokenizer | openai | dynamo | routers | aisimulate)" ;;
  esac
done

# Everything below writes under $ROOT only. A user-level pip.conf (index or proxy settings) is
# kept in use although HOME moves.
if [ -z "${PIP_CONFIG_FILE:-}" ]; then
  for f in "${XDG_CONFIG_HOME:-$REAL_HOME/.config}/pip/pip.conf" "$REAL_HOME/.pip/pip.conf"; do
    if [ -f "$f" ]; then export PIP_CONFIG_FILE=$f; break; fi
  done
fi
mkdir -p "$ROOT/home" "$ROOT/cache" "$ROOT/scratch"
peers_isolate
export XDG_CONFIG_HOME=$ROOT/home/.config PIP_CACHE_DIR=$ROOT/cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1

base_python() {  # the interpreter the venvs are made from, as an absolute path
  local py=${PYTHON:-$(command -v python3.11 || command -v python3 || true)}
  [ -n "$py" ] || die "no python3.11 or python3 on PATH (set PYTHON=...)"
  # Resolve with the real HOME: version managers' shims (pyenv) may look there.
  HOME=$REAL_HOME "$py" -c 'import sys; assert sys.version_info >= (3, 11); print(sys.executable)' \
    2>/dev/null || die "$py is not a working Python >= 3.11 (set PYTHON=...)"
}

ensure_venv() {  # dir
  local dir=$1 py
  if ! "$dir/bin/python" -c '' 2>/dev/null; then
    py=$(base_python)
    rm -rf "$dir"
    "$py" -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install -q "$PIP_PIN"
}

pip_check() {  # dir: report broken requirements, except the one that is expected
  local out
  out=$("$1/bin/python" -m pip check 2>&1 | grep -v -e 'requires aisimulate, which is not installed' \
    -e '^No broken requirements found' || true)
  if [ -n "$out" ]; then echo "warning: pip check in $1:"; echo "$out"; fi
}

install_venv() {  # name: venv $ROOT/venv/NAME from locks/NAME.txt (or resolve_NAME in resolve mode)
  local name=$1 dir=$ROOT/venv/$1 lock=$PEERS_HERE/locks/$1.txt stamp t0=$SECONDS
  stamp="$MODE $(sha256sum < "$lock" | cut -d' ' -f1)"
  if [ "$(cat "$dir/.servesim-setup" 2>/dev/null)" = "$stamp" ] && "$dir/bin/python" -c '' 2>/dev/null; then
    echo "[$name] up to date: $dir"
    return 0
  fi
  ensure_venv "$dir"
  rm -f "$dir/.servesim-setup"
  if [ "$MODE" = lock ]; then
    local wheels=()  # the routers' venv takes wheels only (they carry the Rust binaries)
    if [ "$name" = routers ]; then wheels=(--only-binary=:all:); fi
    "$dir/bin/python" -m pip install -q --no-deps "${wheels[@]}" -r "$lock"
  else
    "resolve_$name" "$dir/bin/python"
  fi
  pip_check "$dir"
  printf '%s\n' "$stamp" > "$dir/.servesim-setup"
  echo "[$name] installed in $((SECONDS - t0)) s: $dir"
}

resolve_openai() { "$1" -m pip install -q openai==3.57.0; }

resolve_routers() {
  "$1" -m pip install -q --only-binary=:all: vllm-router==0.1.17 sglang-router==0.3.2
}

# The plain aisimulate==0.13.0 on PyPI is an sdist stub that downloads from NVIDIA's own index;
# this pre-release has real wheels on PyPI. Wheels only, so nothing is built.
AISIMULATE_PIN=aisimulate==0.13.0.dev202610270000000085
resolve_aisimulate() { "$1" -m pip install -q --only-binary=:all: "$AISIMULATE_PIN"; }

resolve_dynamo() {
  # ai-dynamo 1.6.1 requires aisimulate==0.13.0, which cannot be installed from PyPI (see
  # README). Install ai-dynamo without its dependencies, then its dependencies minus aisimulate.
  "$1" -m pip install -q ai-dynamo-runtime==1.6.1
  "$1" -m pip install -q --no-deps ai-dynamo==1.6.1
  "$1" -m pip install -q 'aiohttp<4.0,>=3.14.3' 'certifi>=2026.10.19' 'kubernetes<33.0.0,>=32.0.1' \
    'msgspec>=0.19.0' 'prometheus-client<1.0,>=0.23.1' 'pyzmq>=26.0.0' 'redis<9.0.0,>=6.2.0' \
    'tqdm>=4.0.0' 'transformers>=4.56.0' 'typing-extensions>=4.10.0' 'zstandard<1.0,>=0.23.0'
}

setup_openai() {
  install_venv openai
  "$ROOT/venv/openai/bin/python" -c 'import openai; print("[openai] openai", openai.__version__)'
}

setup_dynamo() {
  install_venv dynamo
  "$ROOT/venv/dynamo/bin/python" -c 'import importlib.metadata as m, dynamo.replay, dynamo.frontend, dynamo.mocker, dynamo.indexer, zmq
print("[dynamo] ai-dynamo", m.version("ai-dynamo"), "/ ai-dynamo-runtime", m.version("ai-dynamo-runtime"))'
}

setup_routers() {
  install_venv routers
  "$ROOT/venv/routers/bin/vllm-router" --version 2>/dev/null | head -1 || true
  "$ROOT/venv/routers/bin/python" -c 'import importlib.metadata as m, sglang_router
print("[routers] vllm-router", m.version("vllm-router"), "/ sglang-router", m.version("sglang-router"))'
}

setup_aisimulate() {
  install_venv aisimulate
  "$ROOT/venv/aisimulate/bin/python" -c 'import importlib.metadata as m, aisimulate.predict
print("[aisimulate] aisimulate", m.version("aisimulate"))'
}

tokenizer_ok() {  # dir
  [ -f "$1/config.json" ] && [ -f "$1/tokenizer_config.json" ] && [ -f "$1/tokenizer.json" ] &&
    [ "$(sha256sum < "$1/tokenizer.json" | cut -d' ' -f1)" = "$TOKENIZER_SHA256" ]
}

setup_tokenizer() {
  # A local HF model directory without any hub: the DeepSeek-V3 tokenizer.json (MIT) that the
  # litellm wheel ships, our chat template, and a minimal llama-8B-shaped config.json so the
  # mocker can size its KV cache. Dynamo's frontend and mocker load it with --model-path.
  local out=$ROOT/tokenizer/deepseek-v3-tok t0=$SECONDS
  if tokenizer_ok "$out"; then echo "[tokenizer] up to date: $out"; return 0; fi
  ensure_venv "$ROOT/venv/dynamo"   # for its pip
  tmp=$(mktemp -d "$ROOT/scratch/tokenizer.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  "$ROOT/venv/dynamo/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp/whl" "$LITELLM_PIN"
  "$ROOT/venv/dynamo/bin/python" - "$tmp"/whl/litellm-*.whl "$tmp/out" <<'EOF'
import json, os, sys, zipfile

whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
src = "litellm/litellm_core_utils/tokenizers/"
with zipfile.ZipFile(whl) as z:
    for name, dest in (("deepseek_tokenizer.json", "tokenizer.json"),
                       ("deepseek_tokenizer_LICENSE", "LICENSE.tokenizer")):
        with open(os.path.join(out, dest), "wb") as f:
            f.write(z.read(src + name))
BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
chat = ("{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ m['content'] }}"
        "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
        "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}{{ eos_token }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")
files = {
    "tokenizer_config.json": {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 131072, "clean_up_tokenization_spaces": False,
        "chat_template": chat,
    },
    # Llama-3-8B-like shape: 32 layers, 8 KV heads, head_dim 128 (128 KiB of KV per token in bf16).
    "config.json": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 129280, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    },
    "generation_config.json": {"bos_token_id": 0, "eos_token_id": 1},
}
for name, body in files.items():
    with open(os.path.join(out, name), "w") as f:
        json.dump(body, f, ensure_ascii=False, indent=1)
EOF
  tokenizer_ok "$tmp/out" || die "tokenizer.json from $LITELLM_PIN does not have sha256 $TOKENIZER_SHA256"
  mkdir -p "$ROOT/tokenizer"
  rm -rf "$out"
  mv "$tmp/out" "$out"
  rm -rf "$tmp"
  trap - EXIT
  echo "[tokenizer] built in $((SECONDS - t0)) s: $out"
}

echo "root: $ROOT"
t_all=$SECONDS
for t in "${targets[@]}"; do
  "setup_$t"
done
echo "done in $((SECONDS - t_all)) s"
