"""Check a KubeRay RayJob manifest against the RayJob CRD's schema.

    python docs/scripts/check_rayjob.py CRD.yaml [MANIFEST.yaml]

CRD.yaml: KubeRay's `ray-operator/config/crd/bases/ray.io_rayjobs.yaml` (from a KubeRay release or
its repository; nothing is downloaded here). MANIFEST defaults to docs/kuberay/hflow-rayjob.yaml.
Two checks: the manifest validates against the schema of its apiVersion (types, required keys,
enums: `jsonschema`), and every key it sets is one the schema declares. The second matters because
a CRD's schema does not forbid unknown keys: the API server drops them without a word, so a
misspelt key would pass the first check and do nothing on a cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema
import yaml


def schema_for(crd: dict, api_version: str) -> dict:
    group, version = api_version.split("/")
    if crd["spec"]["group"] != group:
        raise SystemExit(f"the CRD is for group {crd['spec']['group']}, the manifest's apiVersion is {api_version}")
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise SystemExit(f"the CRD has no version {version}")


def unknown_keys(value, schema: dict, path: str = "") -> list[str]:
    """Keys of `value` that `schema` does not declare, as dotted paths."""
    found = []
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_keys(item, props[key], where)
            elif isinstance(extra, dict):
                found += unknown_keys(item, extra, where)
            elif props is not None or extra is False:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_keys(item, schema["items"], f"{path}[{i}]")
    return found


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    crd = yaml.safe_load(Path(argv[0]).read_text())
    manifest_path = Path(argv[1]) if len(argv) > 1 else Path(__file__).parents[1] / "kuberay" / "hflow-rayjob.yaml"
    manifest = yaml.safe_load(manifest_path.read_text())
    schema = schema_for(crd, manifest["apiVersion"])
    jsonschema.validate(manifest, schema)
    unknown = unknown_keys(manifest, schema)
    if unknown:
        print(f"{manifest_path}: keys the RayJob schema does not declare: {', '.join(unknown)}", file=sys.stderr)
        return 1
    print(f"{manifest_path}: valid against {argv[0]} ({manifest['apiVersion']} {manifest['kind']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
