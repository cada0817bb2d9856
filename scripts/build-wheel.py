#!/usr/bin/env python3
"""Build the servesim wheel: the mockserve and loadgen binaries plus the `servesim` Python
package (python/servesim), as one platform wheel, with the standard library only.

    scripts/build-wheel.py --mockserve target/release/mockserve \
        --loadgen target/release/loadgen --out dist/

writes dist/servesim-VERSION-py3-none-linux_x86_64.whl, VERSION being Cargo.toml's
[workspace.package] version. Inside: servesim/*.py, the two binaries under
servesim-VERSION.data/scripts/ (pip installs them into the environment's bin/, executable), and
servesim-VERSION.dist-info/ with METADATA, WHEEL (Root-Is-Purelib: false), entry_points.txt (the
pytest plugin under pytest11) and RECORD (sha256 of every file). Entries are sorted and dated
SOURCE_DATE_EPOCH (default 1980-01-01), so the same inputs give the same bytes.

The binaries are whatever you pass: static release binaries (scripts/build-image.sh builds them)
run on any x86_64 Linux; debug binaries only where they were built.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import stat
import sys
import time
import zipfile
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "servesim"
NAME = "servesim"
SUMMARY = (
    "mockserve (an OpenAI-compatible server over a simulated LLM engine) and loadgen, "
    "with a pytest fixture"
)


def workspace_version(cargo_toml: Path) -> str:
    """The `version` of Cargo.toml's [workspace.package] table."""
    text = cargo_toml.read_text(encoding="utf-8")
    section = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not section:
        raise SystemExit(f"{cargo_toml}: no [workspace.package] table")
    version = re.search(r'^version\s*=\s*"([^"]+)"\s*$', section.group(1), re.M)
    if not version:
        raise SystemExit(f"{cargo_toml}: [workspace.package] has no version")
    return version.group(1)


def workspace_license(cargo_toml: Path) -> str:
    """The `license` of Cargo.toml's [workspace.package] table (Apache-2.0 if absent)."""
    text = cargo_toml.read_text(encoding="utf-8")
    found = re.search(r'^license\s*=\s*"([^"]+)"\s*$', text, re.M)
    return found.group(1) if found else "Apache-2.0"


def record_hash(data: bytes) -> str:
    """RECORD's digest form: sha256=URL-safe base64 without padding."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def metadata(version: str, license_name: str) -> str:
    readme = (
        "servesim ships two executables and a small Python package:\n\n"
        "* `mockserve`: an OpenAI-compatible HTTP server over a simulated inference engine "
        "(continuous batching, paged KV cache, KV-aware routing, vLLM metrics and KV events);\n"
        "* `loadgen`: a load generator for OpenAI-compatible endpoints;\n"
        "* `servesim.MockServer` and the pytest fixtures `mockserve` / `mockserve_factory`.\n\n"
        "```python\n"
        "def test_chat(mockserve):\n"
        "    client = openai.OpenAI(base_url=mockserve.base_url, api_key=\"unused\")\n"
        "```\n"
    )
    headers = [
        ("Metadata-Version", "2.1"),
        ("Name", NAME),
        ("Version", version),
        ("Summary", SUMMARY),
        ("License", license_name),
        ("Requires-Python", ">=3.8"),
        ("Classifier", "Framework :: Pytest"),
        ("Classifier", "Operating System :: POSIX :: Linux"),
        ("Classifier", "Programming Language :: Python :: 3"),
        ("Classifier", "Programming Language :: Rust"),
        ("Classifier", "Topic :: Software Development :: Testing"),
        ("Description-Content-Type", "text/markdown"),
    ]
    return "".join(f"{k}: {v}\n" for k, v in headers) + "\n" + readme


def wheel_file(tag: str) -> str:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: servesim scripts/build-wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    )


def build(mockserve: Path, loadgen: Path, out: Path, platform: str, level: int) -> Path:
    version = workspace_version(ROOT / "Cargo.toml")
    tag = f"py3-none-{platform}"
    dist_info = f"{NAME}-{version}.dist-info"
    data_scripts = f"{NAME}-{version}.data/scripts"

    # (name in the wheel, contents, executable)
    files: List[Tuple[str, bytes, bool]] = []
    sources = sorted(p for p in PACKAGE.iterdir() if p.is_file() and p.suffix in (".py", ".typed"))
    if not any(p.name == "__init__.py" for p in sources):
        raise SystemExit(f"{PACKAGE}: no __init__.py")
    for path in sources:
        files.append((f"{NAME}/{path.name}", path.read_bytes(), False))
    for name, path in (("mockserve", mockserve), ("loadgen", loadgen)):
        if not path.is_file() or not os.access(path, os.X_OK):
            raise SystemExit(f"{path}: not an executable file (the {name} binary)")
        files.append((f"{data_scripts}/{name}", path.read_bytes(), True))
    files.append((f"{dist_info}/METADATA", metadata(version, workspace_license(ROOT / "Cargo.toml")).encode(), False))
    files.append((f"{dist_info}/WHEEL", wheel_file(tag).encode(), False))
    files.append(
        (f"{dist_info}/entry_points.txt", b"[pytest11]\nservesim = servesim.pytest_plugin\n", False)
    )
    files.append((f"{dist_info}/top_level.txt", b"servesim\n", False))

    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data, _ in files)
    record += f"{record_name},,\n"
    files.append((record_name, record.encode(), False))

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    date_time = time.gmtime(max(epoch, 315532800))[:6]
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{NAME}-{version}-{tag}.whl"
    partial = target.with_suffix(".whl.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as whl:
        for name, data, executable in files:
            info = zipfile.ZipInfo(name, date_time=date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if executable else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            whl.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=level)
    partial.replace(target)
    return target


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mockserve", type=Path, required=True, help="the mockserve binary")
    parser.add_argument("--loadgen", type=Path, required=True, help="the loadgen binary")
    parser.add_argument("--out", type=Path, required=True, help="directory the wheel goes to")
    parser.add_argument(
        "--platform",
        default="linux_x86_64",
        help="platform tag (default linux_x86_64; static binaries could be tagged manylinux "
        "once checked with auditwheel)",
    )
    parser.add_argument(
        "--compress-level",
        type=int,
        choices=range(0, 10),
        default=6,
        metavar="0-9",
        help="deflate level (default 6; 1 is much faster on large debug binaries)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    target = build(args.mockserve, args.loadgen, args.out, args.platform, args.compress_level)
    size_mb = target.stat().st_size / 1e6
    print(f"{target} ({size_mb:.1f} MB, {time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
