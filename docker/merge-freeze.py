"""Merge `pip freeze` outputs made under different Pythons into one constraints list.

    python docker/merge-freeze.py 3.11=freeze-311.txt 3.12=freeze-312.txt
    python docker/merge-freeze.py --keep docker/constraints.txt 3.11=new-311.txt 3.12=new-312.txt

A pin shared by every Python is written plain; one that differs (or that only some
Pythons install) gets a `python_version` marker for the range of Pythons it was
resolved under: the oldest Python's pins also cover older ones, the newest's newer
ones (e.g. vLLM 0.32 needs setuptools < 81 on 3.12 only). Used by docker/lock.sh.

--keep FILE also prints every pin line of FILE unchanged (its comments are left out),
sorted in among the merged ones: docker/lock.sh's incremental mode adds the pins that
a dry run with FILE as constraints found missing (the freezes then hold only those).
"""

import re
import sys
from pathlib import Path


def read_freeze(path: str) -> dict[str, str]:
    pins = {}
    for line in Path(path).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def marker(versions: list[str], i: int) -> str:
    bounds = []
    if i > 0:
        bounds.append(f'python_version >= "{versions[i]}"')
    if i < len(versions) - 1:
        bounds.append(f'python_version < "{versions[i + 1]}"')
    return " and ".join(bounds)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def merged(freezes: dict[str, str]) -> list[str]:
    versions = sorted(freezes, key=version_key)
    pins = {v: read_freeze(freezes[v]) for v in versions}
    lines = []
    for name in sorted({n for p in pins.values() for n in p}, key=canonical):
        found = [pins[v].get(name) for v in versions]
        if len(set(found)) == 1:
            lines.append(f"{name}=={found[0]}")
            continue
        for i, version in enumerate(found):
            if version is not None:
                lines.append(f"{name}=={version} ; {marker(versions, i)}")
    return lines


def main(args: list[str]) -> None:
    kept = []
    if args[:1] == ["--keep"]:
        kept = [line for line in Path(args[1]).read_text().splitlines() if line.strip() and not line.startswith("#")]
        args = args[2:]
    lines = merged(dict(arg.split("=", 1) for arg in args))
    # A stable sort by name: the kept lines come first among lines of one name, in their order.
    for line in sorted(kept + lines, key=lambda line: canonical(re.split(r"[\s=<>!~;]", line, maxsplit=1)[0])):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
