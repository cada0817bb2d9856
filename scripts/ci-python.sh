#!/usr/bin/env bash
# The Python package end to end: `pip install .` of this checkout into a fresh venv in a temporary
# directory (maturin builds the wheel from pyproject.toml, on the dev profile so that it reuses the
# debug build CI already made: only loadgen's crate and the two binaries are compiled again), with
# pinned openai, anthropic and pytest, then python/tests against the installed package. Fails on
# any failure, and when no test ran.
#
#   scripts/ci-python.sh
#
# Needs python3 (3.8+, with venv), cargo, and on the first run access to a Python package index
# for maturin, openai, anthropic and pytest; after it, nothing (their wheels are kept).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-"$here/target"}
maturin_version=1.16.0
openai_version=3.57.0
anthropic_version=2.17.0
pytest_version=9.2.0

work=$(mktemp -d "${TMPDIR:-/tmp}/servesim-ci-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS

# The pinned packages' wheels are downloaded once into $target/ci-python-wheels (kept across runs,
# like the build itself); the venv is new, and pip installs from that folder only.
pins=("maturin==$maturin_version" "openai==$openai_version" "anthropic==$anthropic_version"
    "pytest==$pytest_version")
wheelhouse="$target/ci-python-wheels/maturin-$maturin_version-openai-$openai_version-anthropic-$anthropic_version-pytest-$pytest_version"
if [[ ! -f $wheelhouse/.complete ]]; then
    rm -rf "$wheelhouse"
    python3 -m pip download --quiet --disable-pip-version-check --dest "$wheelhouse" "${pins[@]}"
    touch "$wheelhouse/.complete"
fi
offline=(--quiet --disable-pip-version-check --no-index --find-links "$wheelhouse")
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install "${offline[@]}" "${pins[@]:1}"
echo "ci-python: test dependencies installed after $(( SECONDS - started )) s"

# pip builds in the checkout (maturin's isolated build environment comes from the wheelhouse too);
# deflate level 1, the debug binaries being large and the wheel never leaving this machine.
MATURIN_PEP517_ARGS="--profile dev --compression-level 1" \
    "$work/venv/bin/python" -m pip install "${offline[@]}" "$here"
echo "ci-python: pip install . done after $(( SECONDS - started )) s"

# From outside the checkout, with the venv's bin/ first on PATH (as if activated), so the tests
# see the installed package and binaries, not python/servesim.
cd "$work"
status=0
PATH="$work/venv/bin:$PATH" timeout 600 "$work/venv/bin/python" -m pytest \
    -p no:cacheprovider -q -rfEs "$here/python/tests" || status=$?
if (( status == 5 )); then
    echo "ci-python: no tests ran" >&2
fi
echo "ci-python: $(( SECONDS - started )) s"
exit "$status"
