"""The KubeRay RayJob manifest of docs/several-machines.md: it parses, its entrypoint is a command
hflow has (checked as the docs' commands are), and the schema check it was put through finds a key
a schema does not declare (the check itself, on a small schema: the CRD is not in the repository)."""

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "kuberay" / "hflow-rayjob.yaml"
sys.path[:0] = [str(Path(__file__).parent), str(ROOT / "docs" / "scripts")]

pytest.importorskip("jsonschema")  # the docs' extra (not on a bare CUDA image, where `pytest -m gpu` collects this)
from check_rayjob import unknown_keys  # noqa: E402
from test_commands import check_command  # noqa: E402


def test_the_manifest_is_a_rayjob_whose_entrypoint_hflow_runs(monkeypatch):
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayJob")
    entrypoint = manifest["spec"]["entrypoint"]
    assert entrypoint.startswith("hflow train ") and "--output-dir /runs" in entrypoint
    monkeypatch.chdir(ROOT)
    assert check_command(entrypoint) is None
    cluster = manifest["spec"]["rayClusterSpec"]
    mounts = [{m["mountPath"] for m in group["template"]["spec"]["containers"][0]["volumeMounts"]}
              for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]]
    assert all("/runs" in m for m in mounts)  # the run directory on every pod, outliving the cluster


def test_the_schema_check_finds_undeclared_keys_where_the_schema_allows_them():
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "entrypoint": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "groups": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}}}
    good = {"spec": {"entrypoint": "hflow train x", "labels": {"any": "key"}, "groups": [{"name": "gpu"}]}}
    assert unknown_keys(good, schema) == []
    bad = {"spec": {"entrypiont": "hflow train x", "groups": [{"name": "gpu", "replica": 2}]}}
    assert unknown_keys(bad, schema) == ["spec.entrypiont", "spec.groups[0].replica"]
