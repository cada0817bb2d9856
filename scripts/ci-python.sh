#!/usr/bin/env bash
# The Python package end to end: builds the servesim wheel from the debug binaries the test
# command already built (mockserve, loadgen under $CARGO_TARGET_DIR/debug, default target/),
# installs it with pinned openai, anthropic and pytest into a fresh venv in a temporary directory,
# and runs python/tests against the installed package. Fails on any failure, and when no test ran.
#
#   scripts/ci-python.sh
#
# Needs python3 (3.8+, with venv) and, on the first run, access to a Python package index for
# openai, anthropic and pytest.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-"$here/target"}
openai_version=3.57.0
anthropic_version=2.17.0
pytest_version=9.2.0

for bin in mockserve loadgen; do
    if [[ ! -x "$target/debug/$bin" ]]; then
        echo "ci-python: $target/debug/$bin missing; run the test command first" \
            "(cargo build --locked -p mock_server -p loadgen)" >&2
        exit 1
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/servesim-ci-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS

# The pinned test dependencies install while the wheel is built. Their wheels are downloaded once
# into $target/ci-python-wheels (kept across runs, like the build itself); the venv is new.
pins=("openai==$openai_version" "anthropic==$anthropic_version" "pytest==$pytest_version")
wheelhouse="$target/ci-python-wheels/openai-$openai_version-anthropic-$anthropic_version-pytest-$pytest_version"
install_deps() {
    if [[ ! -f $wheelhouse/.complete ]]; then
        rm -rf "$wheelhouse"
        python3 -m pip download --quiet --disable-pip-version-check --dest "$wheelhouse" "${pins[@]}"
        touch "$wheelhouse/.complete"
    fi
    "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
        --find-links "$wheelhouse" "${pins[@]}"
}
python3 -m venv "$work/venv"
install_deps &
deps=$!
# Deflate level 1: the debug binaries are large and the wheel never leaves this directory.
python3 "$here/scripts/build-wheel.py" --mockserve "$target/debug/mockserve" \
    --loadgen "$target/debug/loadgen" --out "$work/dist" --compress-level 1
wait "$deps"
echo "ci-python: wheel built and dependencies installed after $(( SECONDS - started )) s"
wheel=$(ls "$work"/dist/servesim-*.whl)
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel"
echo "ci-python: wheel installed after $(( SECONDS - started )) s"

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
