#!/usr/bin/env bash
# Validates every Kubernetes manifest in deploy/ offline, in strict mode (unknown fields are
# errors), against the schemas of one pinned Kubernetes version, with a pinned
# kubernetes-validate in a throwaway venv under $CARGO_TARGET_DIR (default target/). Custom
# resources the core schemas cannot know: InferencePool is checked against
# deploy/schemas/inferencepool-inference.networking.k8s.io-v1.json (its metadata against the core
# ObjectMeta); any other is skipped by name and listed (SKIP lines). Also, without kubectl
# kustomize: every resource a kustomization.yaml lists exists, every YAML file in deploy/ is
# listed by the kustomization.yaml of its directory, and cross-references hold (selectors match
# pod labels, named ports exist, volumes name existing claims, embedded YAML parses, the Indexed
# Job's shard count matches completions, parallelism and the merge Job's files).
# Exits non-zero on any error.
#
#   scripts/ci-k8s.sh
#
# Needs python3 (3.8+, with venv) and, on the first run, access to a Python package index.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-"$here/target"}
validator_version=1.37.0
kubernetes_version=1.33.0
venv="$target/ci-k8s-venv"

if ! "$venv/bin/python" -c "import kubernetes_validate.version as v, sys
sys.exit(v.__version__ != '$validator_version')" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "kubernetes-validate==$validator_version"
fi

exec "$venv/bin/python" - "$here/deploy" "$kubernetes_version" <<'PY'
import json
import re
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv
import yaml
from referencing import Registry, Resource

deploy = Path(sys.argv[1])
k8s_version = sys.argv[2]
errors = []
skipped = []
checked = 0

# Custom resources: validated against a schema of ours, or skipped by name.
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"):
        deploy / "schemas" / "inferencepool-inference.networking.k8s.io-v1.json",
}
SKIP = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "Gateway API CRD, not in the core schemas",
}


def error(where, message):
    errors.append(f"{where}: {message}")


def rel(path):
    return path.relative_to(deploy.parent)


# --- kustomizations -------------------------------------------------------------------------
yamls = sorted(p for p in deploy.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
listed = set()
for kustomization in (p for p in yamls if p.name == "kustomization.yaml"):
    try:
        data = yaml.safe_load(kustomization.read_text()) or {}
    except yaml.YAMLError as e:
        error(rel(kustomization), f"not YAML: {e}")
        continue
    if data.get("kind") != "Kustomization":
        error(rel(kustomization), "kind is not Kustomization")
    for entry in data.get("resources") or []:
        path = (kustomization.parent / entry).resolve()
        if not path.exists():
            error(rel(kustomization), f"lists {entry}, which does not exist")
        elif path.is_dir() and not (path / "kustomization.yaml").is_file():
            error(rel(kustomization), f"lists directory {entry}, which has no kustomization.yaml")
        elif path.is_file():
            if path.parent != kustomization.parent.resolve():
                error(rel(kustomization), f"lists {entry} outside its directory")
            listed.add(path)
for path in yamls:
    if path.name == "kustomization.yaml":
        continue
    if not (path.parent / "kustomization.yaml").is_file():
        error(rel(path), "its directory has no kustomization.yaml")
    elif path.resolve() not in listed:
        error(rel(path), f"not listed in {rel(path.parent / 'kustomization.yaml')}")

# --- schemas ---------------------------------------------------------------------------------
definitions_path = (
    Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    / f"v{k8s_version}-local-strict" / "_definitions.json"
)
if not definitions_path.is_file():
    sys.exit(f"kubernetes-validate {kubernetes_validate.version.__version__} has no schemas for {k8s_version}")
definitions = Resource.from_contents(json.loads(definitions_path.read_text()))

resources = []  # (path, document)
for path in yamls:
    if path.name == "kustomization.yaml":
        continue
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        error(rel(path), f"not YAML: {e}")
        continue
    if not documents:
        error(rel(path), "no documents")
    for document in documents:
        if not isinstance(document, dict) or "apiVersion" not in document or "kind" not in document:
            error(rel(path), "a document without apiVersion and kind")
            continue
        resources.append((path, document))

for path, document in resources:
    key = (document["apiVersion"], document["kind"])
    name = f"{rel(path)} {document['kind']}/{document.get('metadata', {}).get('name', '?')}"
    if key in SKIP:
        skipped.append(f"{name} ({key[0]}: {SKIP[key]})")
        continue
    checked += 1
    if key in CRD_SCHEMAS:
        schema = json.loads(CRD_SCHEMAS[key].read_text())
        registry = Resource.from_contents(schema) @ (definitions @ Registry())
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
        for e in validator.iter_errors(document):
            error(name, f"{'.'.join(map(str, e.path))}: {e.message}")
        numbers = [p.get("number") for p in document.get("spec", {}).get("targetPorts", [])]
        if len(numbers) != len(set(numbers)):
            error(name, "targetPorts: port numbers must be unique")
        continue
    try:
        kv.validate(document, k8s_version, strict=True)
    except kv.ValidationError as e:
        error(name, f"{'.'.join(map(str, e.path))}: {e.message}")
    except kv.SchemaNotFoundError as e:
        error(name, f"{e.message} (a custom resource? give it a schema or skip it by name)")

# --- cross-references --------------------------------------------------------------------------
def pod_specs():
    for path, d in resources:
        spec = d.get("spec") or {}
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield path, d, spec.get("template") or {}


pod_labels = []
claims = {d["metadata"]["name"] for _, d in resources if d["kind"] == "PersistentVolumeClaim"}
services = {d["metadata"]["name"]: d for _, d in resources if d["kind"] == "Service"}
for path, d, template in pod_specs():
    name = f"{rel(path)} {d['kind']}/{d['metadata']['name']}"
    labels = (template.get("metadata") or {}).get("labels") or {}
    pod_labels.append(labels)
    selector = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if d["kind"] != "Job" and not selector:
        error(name, "no selector.matchLabels")
    if any(labels.get(k) != v for k, v in selector.items()):
        error(name, f"selector {selector} does not match the pod labels {labels}")
    if d["kind"] == "StatefulSet":
        headless = services.get(d["spec"].get("serviceName"))
        if headless is None or headless["spec"].get("clusterIP") != "None":
            error(name, f"serviceName {d['spec'].get('serviceName')} is not a headless Service here")
    pod = template.get("spec") or {}
    for volume in pod.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in claims:
            error(name, f"volume {volume['name']} names claim {claim}, defined nowhere in deploy/")
    for container in pod.get("containers") or []:
        ports = {p.get("name") for p in container.get("ports") or []}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = ((container.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in ports:
                error(name, f"{probe} uses port {port}, not a port of container {container['name']}")
for svc_name, svc in services.items():
    selector = svc["spec"].get("selector") or {}
    if selector and not any(all(l.get(k) == v for k, v in selector.items()) for l in pod_labels):
        error(f"Service/{svc_name}", f"selector {selector} matches no pod template in deploy/")
for path, d in resources:
    if d["kind"] == "ConfigMap":
        for key, value in (d.get("data") or {}).items():
            if key.endswith((".yaml", ".yml")):
                try:
                    yaml.safe_load(value)
                except yaml.YAMLError as e:
                    error(f"{rel(path)} ConfigMap/{d['metadata']['name']}", f"{key}: not YAML: {e}")

# The Indexed Job's shard count, its completions and parallelism, and the merge Job's files.
for path, d in resources:
    spec = d.get("spec") or {}
    if d["kind"] != "Job" or spec.get("completionMode") != "Indexed":
        continue
    name = f"{rel(path)} Job/{d['metadata']['name']}"
    args = " ".join(a for c in spec["template"]["spec"]["containers"] for a in c.get("args", []))
    shards = re.search(r"--shard=\$\(JOB_COMPLETION_INDEX\)/(\d+)", args)
    if not shards:
        error(name, "no --shard=$(JOB_COMPLETION_INDEX)/N argument")
        continue
    n = int(shards.group(1))
    if not (spec.get("completions") == spec.get("parallelism") == n):
        error(name, f"--shard .../{n}, completions {spec.get('completions')}, parallelism {spec.get('parallelism')} differ")
    for merge_path, merge in resources:
        merge_args = [a for c in ((merge.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers", []) for a in c.get("args", [])]
        if merge["kind"] == "Job" and merge_args[:1] == ["merge"]:
            files = [a for a in merge_args[1:] if not a.startswith("--")]
            expected = [f"/records/shard-{i}.jsonl" for i in range(n)]
            if files != expected:
                error(f"{rel(merge_path)} Job/{merge['metadata']['name']}", f"merges {files}, expected {expected}")

for line in skipped:
    print(f"SKIP {line}")
for line in errors:
    print(f"ERROR {line}")
print(f"ci-k8s: {checked} resources in {len(yamls)} files validated against Kubernetes {k8s_version} "
      f"(kubernetes-validate {kubernetes_validate.version.__version__}, strict); "
      f"{len(skipped)} skipped; {len(errors)} errors")
sys.exit(1 if errors else 0)
PY
