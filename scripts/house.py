#!/usr/bin/env python3
"""The shape of the house: import circles between files, upward imports between layers, long files
and public items per crate.

Usage: python3 scripts/house.py [--max-lines N] [--circles-only] [--imports]
       (from anywhere inside the repository)

For every crate of the workspace it reads the Rust files under its `src/`, takes the paths each
file names through `crate::` and `super::` (in `use` items and inline), resolves them to the file
that defines that module, and prints:

- every import circle between files (a strongly connected group of two or more files); a
  parent's `mod child;` declaration is not an import, and a file's own `#[cfg(test)]` tail is
  left out;
- every upward import between folders, for the crates with a written layer list (`LAYERS`):
  each top-level module of the crate (a folder or a file under `src/`) sits in one layer, from
  the bottom up, and may name only modules of lower layers; naming a module of its own layer
  (sideways) or of a higher one is an upward import. `lib.rs` and `main.rs` stand above every
  layer; a top-level module missing from the list is an error of its own (a new folder gets a
  place in the list). With --imports, every offending import is listed file by file;
- every file longer than --max-lines (default 800), not counting test files and a file's
  `#[cfg(test)]` tail;
- the count of `pub`, `pub(crate)` and other restricted items per crate;
- every dependency whose features differ between a workspace build and a lone build of one of
  the two installed binaries' packages (`cargo install --path mock_server` or `--path loadgen`),
  from `cargo tree`: such a difference makes the one rebuild what the other built.

Exits 1 when it finds a circle, an upward import, a module missing from a layer list, a
feature difference or a long file (with --circles-only, long
files are listed only: what CI runs), so a check can call it. Standard library and cargo only.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

CRATES = {
    "servesim": "src",
    "mock_server": "mock_server/src",
    "loadgen": "loadgen/src",
    "indexer_bench": "indexer_bench/src",
    "servesim_fuzzing": "fuzzing/src",
}

# Each crate's layers from the bottom up; a layer is a tuple of top-level modules (a folder or a
# file under `src/`), which may name modules of lower layers only, never one of their own layer.
LAYERS = {
    "loadgen": (
        ("stdout",),
        ("error",),
        ("limits", "capped", "write"),
        ("run",),          # one request on the wire, the driver, the target, failures, shards
        ("dataset",),      # real prompts, counted with the target's tokenizer
        ("observe",),      # the live view and the server's metrics
        ("report",),       # report files, charts, the HTML report
        ("harness",),      # one run: connect, observe, drive, report, write
        ("convert", "multiturn", "replay", "bench", "profile"),  # the modes
        ("sweep", "merge", "calibrate"),                                  # modes over other modes
    ),
    "mock_server": (
        ("stdout", "timer", "text", "output_length"),
        ("metrics",),
        ("kv_events",),
        ("fault",),        # the seeded draws; the HTTP middleware is api/fault.rs
        ("config",),
        ("driver",),
        ("api",),
        ("connection",),
        ("args", "synthetic"),  # engine and trace flags; synthetic load instead of a trace
        ("fleet",),
        ("cmd",),
        ("plan", "test_kit"),  # the configuration search replays through cmd::replay
    ),
}

PATH_RE = re.compile(r"\b(crate|super)((?:::\w+)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super)((?:::\w+)*)::\{([^;]*)\}", re.S)
PUB_RE = re.compile(r"^\s*pub(\([^)]*\))?\s+(?:unsafe\s+|async\s+|const\s+)*"
                    r"(fn|struct|enum|trait|type|const|static|mod|use)\b", re.M)


def module_path(root: Path, file: Path) -> tuple:
    """The module path of a file: src/a/b.rs -> ("a", "b"); src/a/mod.rs -> ("a",)."""
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


TEST_TAIL_RE = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*mod\s+\w+\s*\{", re.M)


def without_tests(text: str) -> str:
    """The file without its trailing `#[cfg(test)]` module."""
    cut = TEST_TAIL_RE.search(text)
    return text[: cut.start()] if cut else text


def code_of(text: str) -> str:
    """The file without comments and without its trailing `#[cfg(test)]` module."""
    return re.sub(r"//[^\n]*", "", without_tests(text))


def resolve(modules: dict, path: tuple):
    """The file of the longest module prefix of `path`."""
    for n in range(len(path), -1, -1):
        if path[:n] in modules:
            return modules[path[:n]]
    return None


def edges_of(modules: dict, here: tuple, is_dir_module: bool, code: str) -> set:
    """The files that `code` (the file of module `here`) imports from."""
    base_super = here[:-1]
    found = set()

    def add(kind: str, rest: str):
        names = tuple(p for p in rest.split("::") if p)
        if kind == "crate":
            target = names
        else:
            parent = list(base_super)
            while names and names[0] == "super":
                parent = parent[:-1]
                names = names[1:]
            target = tuple(parent) + names
        file = resolve(modules, target)
        if file is not None:
            found.add(file)

    for m in USE_GROUP_RE.finditer(code):
        for item in re.split(r",", m.group(3)):
            item = item.strip().split(" as ")[0].strip()
            if not item or item in ("self", "*") or item.startswith("{"):
                add(m.group(1), m.group(2))
                continue
            add(m.group(1), m.group(2) + "::" + item.split("::{")[0])
    for m in PATH_RE.finditer(code):
        add(m.group(1), m.group(2))
    return found


def circles(graph: dict) -> list:
    """Strongly connected groups of two or more files (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


INSTALLED = ("mock_server", "loadgen")

TREE_LINE_RE = re.compile(r"(\S+ v\S+)(?: \(.*?\))? \[(.*)\]$")


def features(top: Path, selection: list) -> dict:
    """Every dependency (normal and build edges) of `selection` -> its resolved features."""
    out = subprocess.run(["cargo", "tree", "--locked", "-e", "normal,build", "--prefix", "none",
                          "--no-dedupe", "-f", "{p} [{f}]"] + selection, cwd=top,
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = TREE_LINE_RE.match(line.strip())
        if m:
            found[m.group(1)] = set(f for f in m.group(2).split(",") if f)
    return found


def feature_differences(top: Path) -> list:
    """(package built alone, dependency, features only the workspace build has, only the lone)."""
    workspace = features(top, ["--workspace"])
    differences = []
    for package in INSTALLED:
        for dep, feats in sorted(features(top, ["-p", package]).items()):
            other = workspace.get(dep, set())
            if feats != other:
                differences.append((package, dep, sorted(other - feats), sorted(feats - other)))
    return differences


def upward_imports(crate: str, root: Path, graph: dict) -> tuple:
    """([(file, imported file)] naming a module of the same or a higher layer, [top-level modules
    missing from the layer list]) for a crate with a layer list; ([], []) otherwise."""
    layers = LAYERS.get(crate)
    if layers is None:
        return [], []
    level = {m: i for i, layer in enumerate(layers) for m in layer}
    missing = set()

    def top(f: Path):
        path = module_path(root, f)
        if not path:
            return None  # lib.rs / main.rs: above every layer
        if path[0] not in level:
            missing.add(path[0])
        return path[0]

    found = []
    for f, targets in sorted(graph.items()):
        a = top(f)
        for t in sorted(targets):
            b = top(t)
            if a is None or b is None or a == b or a not in level or b not in level:
                continue
            if level[b] >= level[a]:
                found.append((f, t))
    return found, sorted(missing)


def is_test_file(path: Path) -> bool:
    return path.name in ("tests.rs", "test.rs") or "tests" in path.parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lines", type=int, default=800)
    parser.add_argument(
        "--circles-only",
        action="store_true",
        help="fail on import circles, upward imports and feature differences only (long files are listed, "
             "not failed): what CI checks",
    )
    parser.add_argument("--imports", action="store_true",
                        help="list every upward import file by file")
    args = parser.parse_args()
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, check=True).stdout.strip())
    bad = False
    long_files = []
    print("crate             files  circles  upward imports   pub  pub(restricted)")
    all_circles = []
    all_upward = []
    all_missing = []
    for crate, src in CRATES.items():
        root = top / src
        files = sorted(p for p in root.rglob("*.rs"))
        modules = {}
        for f in files:
            if f.name == "main.rs" and (root / "lib.rs").exists():
                continue
            modules[module_path(root, f)] = f
        graph = {}
        pub = restricted = 0
        for f in files:
            text = f.read_text()
            code = code_of(text)
            for m in PUB_RE.finditer(code):
                if m.group(1):
                    restricted += 1
                else:
                    pub += 1
            lines = len(without_tests(text).splitlines())
            if not is_test_file(f) and lines > args.max_lines:
                long_files.append((lines, f.relative_to(top)))
            if f.name == "main.rs" and (root / "lib.rs").exists():
                continue
            here = module_path(root, f)
            graph[f] = {e for e in edges_of(modules, here, f.name == "mod.rs", code) if e != f}
        found = circles(graph)
        all_circles += found
        upward, missing = upward_imports(crate, root, graph)
        all_upward += [(crate, root, a, b) for a, b in upward]
        all_missing += [(crate, m) for m in missing]
        layered = f"{len(upward):>14}" if crate in LAYERS else f"{'(no layers)':>14}"
        print(f"{crate:<17} {len(files):>5}  {len(found):>7}  {layered}  {pub:>4}  "
              f"{restricted:>15}")
    for group in all_circles:
        bad = True
        print("circle: " + " <-> ".join(str(f.relative_to(top)) for f in group))
    for crate, root, a, b in all_upward:
        bad = True
        if args.imports:
            print(f"upward import: {a.relative_to(top)} -> {b.relative_to(top)}")
    if all_upward and not args.imports:
        pairs = sorted({(c, module_path(r, a)[0], module_path(r, b)[0])
                        for c, r, a, b in all_upward})
        for crate, a, b in pairs:
            print(f"upward import: {crate}: {a} -> {b} (--imports lists the files)")
    for crate, m in all_missing:
        bad = True
        print(f"layers: {crate}'s module {m} is in no layer of scripts/house.py's LAYERS")
    for n, f in sorted(long_files, reverse=True):
        bad = bad or not args.circles_only
        print(f"long file: {f} ({n} lines > {args.max_lines})")
    differences = feature_differences(top)
    for package, dep, more, fewer in differences:
        bad = True
        print(f"features: {dep} alone in {package} lacks {more} and adds {fewer} against the "
              "workspace build")
    if not differences:
        print("features: " + " and ".join(f"{p} alone" for p in INSTALLED)
              + " build every dependency with the workspace build's features")
    if not all_circles and not all_upward and not long_files:
        print("no import circles, no upward imports, no file over", args.max_lines,
              "lines outside tests")
    elif not all_circles and not all_upward:
        print("no import circles, no upward imports")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
