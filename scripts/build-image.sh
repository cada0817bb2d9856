#!/usr/bin/env bash
# Builds the servesim container image (Containerfile: FROM scratch, static mockserve and loadgen)
# and checks it without running a container:
#   1. one release build of both binaries, statically linked against glibc
#      (x86_64-unknown-linux-gnu, -C target-feature=+crt-static, symbols stripped);
#   2. checks that `file` calls them statically linked and that they run;
#   3. `podman build` from a staged context (the binaries, /etc/passwd, /etc/group,
#      /etc/nsswitch.conf), tagged servesim:VERSION (Cargo.toml's workspace version);
#   4. exports the image's filesystem (`podman create` + `podman export`, no container is run),
#      runs the exported /mockserve --help and /loadgen --version, starts the exported mockserve
#      on 127.0.0.1, checks GET /health and stops it (SIGTERM, expecting a clean exit); then the
#      same inside the exported filesystem with chroot (no host libraries, `localhost` resolved
#      through the image's nsswitch.conf and an /etc/hosts as runtimes mount one) when allowed;
#   5. prints the image size and the build times.
#
#   scripts/build-image.sh            # IMAGE=name:tag to choose the tag
#
# Needs podman (`apt-get install -y podman`), file, curl. The release profile links with fat LTO:
# a fresh build takes 10-20 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-"$here/target"}
triple=x86_64-unknown-linux-gnu
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$here/Cargo.toml")
image=${IMAGE:-"servesim:$version"}
bin_dir="$target_dir/$triple/release"

for tool in podman file curl; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool not found" >&2; exit 1; }
done

echo "build-image: cargo build --release --target $triple (static)"
build_started=$SECONDS
# --target keeps RUSTFLAGS off build scripts and proc macros (they cannot be static).
RUSTFLAGS='-C target-feature=+crt-static' CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_TARGET_DIR="$target_dir" \
    cargo build --locked --release --target "$triple" -p mock_server -p loadgen \
    --bin mockserve --bin loadgen
build_s=$(( SECONDS - build_started ))

for bin in mockserve loadgen; do
    description=$(file -b "$bin_dir/$bin")
    if [[ $description != *"statically linked"* && $description != *"static-pie linked"* ]]; then
        echo "build-image: $bin is not statically linked: $description" >&2
        exit 1
    fi
    "$bin_dir/$bin" --version
done

work=$(mktemp -d "${TMPDIR:-/tmp}/servesim-image.XXXXXX")
server=""
cleanup() {
    if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server"; fi
    [[ -n ${container:-} ]] && podman rm -f "$container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

rootfs="$work/context/rootfs"
mkdir -p "$rootfs/etc"
install -m 0755 "$bin_dir/mockserve" "$bin_dir/loadgen" "$rootfs/"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
# glibc's built-in files and dns lookups: /etc/hosts (mounted by the runtime), then DNS.
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs"/etc/*

echo "build-image: podman build -t $image"
image_started=$SECONDS
podman build --quiet -t "$image" -f "$here/Containerfile" "$work/context"
image_s=$(( SECONDS - image_started ))

# Check the image's own files, exported, not the ones just staged.
container=$(podman create "$image")
exported="$work/exported"
mkdir -p "$exported"
podman export "$container" | tar -x -C "$exported"
podman rm "$container" >/dev/null
container=""
[[ $(stat -c %a "$exported/mockserve") == 755 ]] || { echo "build-image: /mockserve is not 0755" >&2; exit 1; }
"$exported/mockserve" --help >/dev/null
"$exported/loadgen" --version

# Starts `$@ --port 0`, waits for its address (60 s at most), checks GET /health, stops it.
check_serves() {
    local log="$work/serve.out" address="" status=0
    : >"$log"
    "$@" --port 0 >"$log" 2>"$work/serve.err" &
    server=$!
    for _ in $(seq 1 600); do
        address=$(sed -n 's|^mockserve listening on \(http://[^ ]*\)$|\1|p' "$log")
        [[ -n $address ]] && break
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $address ]]; then
        echo "build-image: mockserve did not start:" >&2
        cat "$work/serve.err" >&2
        return 1
    fi
    curl -fsS --max-time 10 "$address/health"
    echo "  <- $address/health"
    kill -TERM "$server"
    wait "$server" || status=$?
    server=""
    if (( status != 0 )); then
        echo "build-image: mockserve exited with status $status after SIGTERM" >&2
        return 1
    fi
}
check_serves "$exported/mockserve" --host 127.0.0.1
if cp /etc/hosts "$exported/etc/hosts" 2>/dev/null && chroot "$exported" /mockserve --version >/dev/null 2>&1; then
    check_serves chroot "$exported" /mockserve --host localhost
    echo "build-image: inside the image's filesystem (chroot), localhost resolved and /health answered"
else
    echo "build-image: chroot not permitted here; skipped the in-filesystem check"
fi

size_bytes=$(podman image inspect --format '{{.Size}}' "$image")
echo "build-image: $image: $(( size_bytes / 1000000 )) MB ($size_bytes bytes);" \
    "mockserve $(( $(stat -c %s "$bin_dir/mockserve") / 1000000 )) MB," \
    "loadgen $(( $(stat -c %s "$bin_dir/loadgen") / 1000000 )) MB;" \
    "cargo build ${build_s} s, podman build ${image_s} s"
