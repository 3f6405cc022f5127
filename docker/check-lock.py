"""Fail the image build if the environment drifted from docker/constraints.txt.

    python docker/check-lock.py docker/constraints.txt              # the running venv
    python docker/check-lock.py docker/constraints.txt REPORT.json  # a `pip install --report`
    python docker/check-lock.py --unpinned docker/constraints.txt REPORT.json

Every distribution installed in the virtual environment (not the base image's), or
every one a pip report would install, must be pinned in the constraints file at that
version; torch (TORCH_SPEC) and hflow itself are exempt. A miss means pyproject.toml
or the Python version changed since docker/lock.sh last ran: run it again.

--unpinned prints, as `name==version` lines (a freeze for docker/merge-freeze.py), the
distributions of the report that have no pin for the running Python; it checks nothing.
docker/lock.sh's incremental mode (INCREMENTAL=1) adds them to the constraints.
"""

import importlib.metadata as metadata
import json
import re
import sys
import sysconfig
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's copy
    from pip._vendor.packaging.requirements import Requirement

EXEMPT = {"torch", "hflow"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> list[tuple[str, str]]:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    return [(d.metadata["Name"], d.version) for d in metadata.distributions(path=[str(site)])]


def reported(report: str) -> list[tuple[str, str]]:
    entries = json.loads(Path(report).read_text())["install"]
    return [(e["metadata"]["name"], e["metadata"]["version"]) for e in entries]


def read_pins(path: str) -> dict[str, str]:
    """The pins that apply to this Python (lines may carry python_version markers)."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate():
                pins[canonical(req.name)] = str(req.specifier).removeprefix("==")
    return pins


def unpinned(path: str, report: str) -> None:
    pins = read_pins(path)
    for name, version in sorted(reported(report), key=lambda entry: canonical(entry[0])):
        if canonical(name) not in EXEMPT and canonical(name) not in pins:
            print(f"{name}=={version}")


def main(path: str, report: str | None = None) -> None:
    pins = read_pins(path)
    problems = []
    for raw_name, version in reported(report) if report else installed():
        name = canonical(raw_name)
        if name in EXEMPT:
            continue
        if name not in pins:
            problems.append(f"{name}=={version} is installed but not pinned")
        elif pins[name] != version:
            problems.append(f"{name}=={version} is installed but {pins[name]} is pinned")
    if problems:
        sys.exit(f"check-lock.py: {path} does not match the environment; regenerate it with docker/lock.sh:\n  "
                 + "\n  ".join(sorted(problems)))
    what = f"the report {report}" if report else "the environment"
    print(f"check-lock.py: every distribution in {what} is pinned in {path}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--unpinned"]:
        unpinned(*sys.argv[2:4])
    else:
        main(*sys.argv[1:3])
