"""How long a Ray cluster's faults take to end an hflow run, on a two-node cluster on this machine.

    python benchmarks/cluster_faults.py [--rounds 3]

The cluster is the one `tests/e2e/test_several_nodes.py` starts (nodes at 127.0.0.2 and 127.0.0.3,
one CPU slot each, Ray's health check every 0.5 s, 3 misses), with a tiny GRPO recipe:
  node lost    split placement (the reference and reward roles on the second node); once step 2's
               checkpoint is written the second node is killed (its raylet and workers): seconds
               until `hflow train` has exited with its one line;
  driver lost  colocated data parallelism 2 (a rank on each node); after the first step the driver
               gets SIGKILL: seconds until both worker processes are gone (Ray ends a dead driver's
               actors).
Each round starts a fresh cluster. Times are wall-clock on a shared machine: read them as orders of
magnitude, bounded by Ray's timeouts, not as a benchmark of hflow.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HEAD, SECOND = "127.0.0.2", "127.0.0.3"
HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}


def recipe(folder: Path, model: Path, placement: str, steps: int) -> Path:
    path = folder / f"{placement}.yaml"
    path.write_text(yaml.safe_dump({
        "name": placement, "algorithm": "grpo", "model": {"path": str(model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 256}, "rollout": {"n": 4, "max_response_length": 8},
        "actor": {"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16}, "cluster": {"cpu_slots": 2},
        "placement": {"backend": "ray", "mode": placement}, "logging": {"progress": "lines"},
        "trainer": {"total_steps": steps, "prompts_per_step": 8, "save_every": 2, "output_dir": str(folder / "runs")}}))
    return path


def start(path: Path, address: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-m", "hflow", "train", str(path), "--ray-address", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, Path(proc.stderr.readline().split("run directory: ", 1)[1].strip())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one_round(folder: Path, model: Path) -> dict[str, float]:
    from ray.cluster_utils import Cluster

    out = {}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": HEAD, "include_dashboard": False, "_system_config": HEALTH})
    second = cluster.add_node(num_cpus=1, node_ip_address=SECOND)
    try:
        proc, run = start(recipe(folder, model, "split", 200), cluster.address)
        while not (run / "checkpoints" / "step_000002").exists():
            time.sleep(0.05)
        killed = time.monotonic()
        cluster.remove_node(second, allow_graceful=False)
        _, err = proc.communicate(timeout=300)
        out["node lost -> run ended (s)"] = time.monotonic() - killed
        out["last line"] = err.strip().splitlines()[-1][:100]
        cluster.add_node(num_cpus=1, node_ip_address=SECOND)
        proc, run = start(recipe(folder, model, "colocate", 200), cluster.address)
        while not (run / "events.jsonl").exists() or not (run / "events.jsonl").read_text().strip():
            time.sleep(0.05)
        pids = [p["pid"] for pool in json.loads((run / "plan.json").read_text())["pools"] for p in pool["processes"]]
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        while any(alive(pid) for pid in pids):
            time.sleep(0.05)
        out["driver killed -> workers gone (s)"] = time.monotonic() - killed
    finally:
        cluster.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from hflow.engine.models.loading import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_tiny_model(folder / "tiny", "tiny", seed=0)
        rounds = [one_round(folder, model) for _ in range(args.rounds)]
    for key in ("node lost -> run ended (s)", "driver killed -> workers gone (s)"):
        values = [r[key] for r in rounds]
        print(f"{key}: median {statistics.median(values):.1f}, rounds {', '.join(f'{v:.1f}' for v in values)}")
    print("last line of the node-lost run:", rounds[-1]["last line"], "...")


if __name__ == "__main__":
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    main()
