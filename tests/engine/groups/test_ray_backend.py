"""The ray backend: DP=2 equals DP=1, colocated equals split, failures are named and bounded."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_same_adam_step, expired_waits, run_hflow, write_recipe
from hflow.engine.groups.batch import Batch
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.config.load import build_recipe

TESTS = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from hflow.engine.groups.ray_backend import start_local_ray, stop_local_ray

    saved = os.environ.get("PYTHONPATH")
    # Workers import the test reward functions from tests/.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), saved]))
    start_local_ray(num_cpus=2, log_to_driver=False)  # as `hflow train` starts one
    yield ray
    stop_local_ray()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def _recipe(model, **sections):
    data = {"model": {"path": str(model)}, "data": {"train": "synthetic:digits", "synthetic_size": 64},
            "rollout": {"n": 4, "max_response_length": 8},
            "actor": {"lr": 0.01, "micro_batch_size": 4, "mini_batch_size": 16},
            "trainer": {"prompts_per_step": 4, "total_steps": 3}, "logging": {"progress": "lines"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return build_recipe(data, {}, "test")


def _updated_weights(recipe, batch, out_dir):
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    try:
        actor = groups["actor"]
        actor.init_model()
        metrics = actor.update_actor(batch)
        if hasattr(metrics, "get") and hasattr(metrics, "__hflow_future__"):
            metrics = metrics.get()
        actor.export_weights(str(out_dir))
    finally:
        groups.shutdown()
    return load_file(out_dir / "model.safetensors"), metrics


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_dp2_on_ray_equals_dp1_local(ray_cluster, tiny_model, tmp_path, zero_stage):
    local = _recipe(tiny_model, actor={"zero_stage": zero_stage})
    # One rollout batch from the local actor, fed identically to both runs.
    groups = build_worker_groups(local, ["actor"], torch.device("cpu"))
    groups["actor"].init_model()
    from hflow.trainer.data.prompts import PromptData
    from hflow.engine.models.loading import load_tokenizer

    prompts = PromptData(local.data, load_tokenizer(str(tiny_model)), 0, 4).batch(1)
    batch = groups["actor"].generate_sequences(prompts)
    batch |= groups["actor"].compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(1))})
    before = {k: v.clone() for k, v in groups["actor"].worker.train_engine.module.state_dict().items()}

    one, m1 = _updated_weights(local, batch, tmp_path / "dp1")
    two, m2 = _updated_weights(
        _recipe(tiny_model, actor={"zero_stage": zero_stage}, cluster={"cpu_slots": 2},
                placement={"backend": "ray", "mode": "explicit", "pools": {"dp": 2}, "roles": {"actor": "dp"}}),
        batch, tmp_path / "dp2")
    moved = max(float((one[k] - before[k]).abs().max()) for k in one)
    assert moved > 1e-4  # the update did something
    assert_same_adam_step(two, one, lr=0.01, close=1e-5)
    assert m2["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-4)


def _train_events(recipe, tmp_path, name):
    from hflow.trainer.algorithms import grpo
    from hflow.trainer.rundir.writer import RunDir

    recipe.name = name
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    try:
        grpo.train(recipe, run)
    finally:
        run.close()
    return run, run.events()


def test_colocated_and_split_give_the_same_metrics(ray_cluster, tiny_model, tmp_path):
    ray_common = {"backend": "ray"}
    colocated = _recipe(tiny_model, placement={**ray_common, "mode": "colocate"}, grpo={"kl_coef": 0.01})
    split = _recipe(tiny_model, placement={**ray_common, "mode": "split"}, cluster={"cpu_slots": 2},
                    grpo={"kl_coef": 0.01})
    _, a = _train_events(colocated, tmp_path, "colocated")
    run, b = _train_events(split, tmp_path, "split")
    assert len(a) == len(b) == 3
    for ea, eb in zip(a, b):
        for key in ("reward/mean", "kl/mean", "entropy/mean", "actor/loss", "actor/grad_norm"):
            assert eb[key] == pytest.approx(ea[key], rel=1e-4, abs=1e-6), (ea["step"], key)
    plan = json.loads((run.path / "plan.json").read_text())
    assert plan["backend"] == "ray"
    assert {p["name"]: p["roles"] for p in plan["pools"]} == {"actor": ["actor"], "rest": ["reward", "reference"]}
    assert all(e["timing/generate"] > 0 and e["timing/reward"] > 0 for e in b)


def test_killed_worker_process_ends_the_run_with_its_name(ray_cluster, tiny_model, tmp_path, monkeypatch):
    from hflow.engine.groups.worker import WorkerError

    recipe = _recipe(tiny_model, reward={"function": "faulty_rewards:dies_at_second_call"},
                     placement={"backend": "ray", "mode": "split"}, cluster={"cpu_slots": 2},
                     trainer={"save_every": 1})
    expired = expired_waits(monkeypatch)
    with pytest.raises(WorkerError, match=r"reward worker rank 0 failed: its process died"):
        _train_events(recipe, tmp_path, "killed")
    assert expired == []  # reported as the process died, not after a watchdog period
    run = next((tmp_path / "runs").glob("killed-*"))
    assert (run / "checkpoints" / "step_000001" / "COMPLETE").exists()  # the last checkpoint is intact


def test_raising_worker_through_the_cli(tiny_model, tmp_path):
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_model,
        reward={"function": "faulty_rewards:raises_at_second_call"},
        cluster={"cpu_slots": 2}, placement={"backend": "ray", "mode": "split"},
    )
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    result = run_hflow("train", str(recipe), env=env, timeout=300)
    # The user's function raised: the same one line and exit 2 as on the local backend (not a
    # watchdog's "no answer", which would have come after worker_timeout_s).
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("error: reward.function 'faulty_rewards:raises_at_second_call' raised ValueError: "
                    "the reward service is down")
    run = next((tmp_path / "runs").glob("test-*"))
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "reward service is down" in status["error"]


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_generation_uses_the_updated_weights(ray_cluster, tiny_model, tmp_path, zero_stage):
    """After an update on two ranks, greedy rollouts are those of the exported weights: the same
    tokens, the same log-probs to float32 rounding, and far from those of the weights before it."""
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams
    from hflow.engine.models.loading import load_causal_lm, load_tokenizer
    from hflow.trainer.data.prompts import PromptData

    recipe = _recipe(tiny_model, actor={"zero_stage": zero_stage}, cluster={"cpu_slots": 2},
                     placement={"backend": "ray", "mode": "explicit", "pools": {"dp": 2}, "roles": {"actor": "dp"}})
    tok = load_tokenizer(str(tiny_model))
    prompts = PromptData(recipe.data, tok, 0, 4).batch(1)
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    try:
        actor = groups["actor"]
        actor.init_model()
        batch = actor.generate_sequences(prompts)
        batch |= actor.compute_log_prob(batch)
        batch |= Batch({"advantages": torch.randn(16, generator=torch.Generator().manual_seed(2))})
        actor.update_actor(batch).get()
        greedy = Batch(columns=prompts.columns, meta={"step": 2, "greedy": True})
        rollout = actor.generate_sequences(greedy).get()
        actor.export_weights(str(tmp_path / "export"))
    finally:
        groups.shutdown()

    torch.set_num_threads(1)  # the workers run single-threaded: same arithmetic order
    model = load_causal_lm(str(tmp_path / "export"), torch.float32)
    # Every stage decodes through the lean path (ZeRO-3 on whole weights gathered for the rollout):
    # the reference takes the same path, so the arithmetic is the same.
    reference = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, recipe.rollout.batch_size)
    params = SamplingParams(recipe.rollout.max_response_length, greedy=True)
    halves = [reference.generate(prompts["prompt_ids"][i:i + 2], 1, params) for i in (0, 2)]  # greedy: n = 1
    expected = {key: torch.cat([h[key] for h in halves]) for key in ("responses", "rollout_log_probs")}
    width = min(expected["responses"].shape[1], rollout["responses"].shape[1])
    assert torch.equal(rollout["responses"][:, :width], expected["responses"][:, :width])
    # Not bitwise: MKL's float32 products round differently with a weight's address in memory (the
    # same product of a (40, 64) weight copied to 17 offsets in a buffer differs in its last bits at
    # most of them), and the reference loaded from safetensors holds its weights 24 bytes past a
    # 64-byte boundary, the ranks in DeepSpeed's buffers (seen: 2.4e-7 apart at most).
    got, want = rollout["rollout_log_probs"][:, :width], expected["rollout_log_probs"][:, :width]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    before = HFGenerator(load_causal_lm(str(tiny_model), torch.float32), [tok.eos_token_id], tok.pad_token_id,
                         recipe.rollout.batch_size).generate(prompts["prompt_ids"], 1, params)
    seen = min(width, before["rollout_log_probs"].shape[1])
    assert (before["rollout_log_probs"][:, :seen] - want[:, :seen]).abs().max() > 1e-2  # the update is seen


def test_placement_auto_on_cpu_slots_trains_data_parallel(ray_cluster, tiny_model, tmp_path):
    """The auto-mapper's plan drives the run; two data-parallel actor ranks sample rollouts of
    different widths, which they pad to a common shape."""
    recipe = _recipe(tiny_model, placement={"mode": "auto"}, cluster={"cpu_slots": 2},
                     rollout={"max_response_length": 24})
    run, events = _train_events(recipe, tmp_path, "auto")
    plan = json.loads((run.path / "plan.json").read_text())
    assert plan["backend"] == "ray" and "auto_mapper" in plan
    assert sum(len(p["devices"]) for p in plan["pools"]) <= 2
    assert len(events) == 3 and all(e["response_length/mean"] > 0 for e in events)


def test_the_watchdog_names_a_stalled_worker_and_its_process_ends(ray_cluster, monkeypatch):
    """A worker process stopped with SIGSTOP answers nothing: after worker_timeout_s the call
    raises a WorkerError naming the role, rank and call, and shutting the group down ends
    the stopped process."""
    psutil = pytest.importorskip("psutil")
    from faulty_workers import StallingWorker

    from hflow.engine.groups.ray_backend import RayCluster
    from hflow.engine.groups.worker import ResourcePool, WorkerError

    cluster = RayCluster(None, worker_timeout_s=3)
    pool = ResourcePool("stall", ["cpu:0"])
    try:
        group = cluster.add_role(cluster.spawn_pool(pool, use_gpu=False), "reward", StallingWorker, pool)
        process = psutil.Process(group.pid())
        expired = expired_waits(monkeypatch)
        with pytest.raises(WorkerError, match=r"^reward worker rank 0 failed: no answer to stall within 3 s "
                                              r"\(trainer\.worker_timeout_s\)"):
            group.stall()
        assert expired == [3]  # after one period of the watchdog
        assert process.status() == psutil.STATUS_STOPPED
    finally:
        cluster.shutdown()
    process.wait(timeout=30)  # raises if the stopped process outlives the group


def test_every_rank_computes_its_cpu_products_as_the_driver_chose(ray_cluster, monkeypatch):
    """The run's choice (`product_route.settle`, made after this Ray instance started, so not in its
    environment) reaches each rank: no rank measures for itself; so does HFLOW_CPU_KERNELS."""
    from device_workers import DeviceWorker

    from hflow.engine.groups.ray_backend import RayCluster
    from hflow.engine.groups.worker import ResourcePool

    monkeypatch.setenv("HFLOW_CPU_PRODUCTS", "blas")
    monkeypatch.setenv("HFLOW_CPU_KERNELS", "off")
    cluster = RayCluster(None, worker_timeout_s=120)
    pool = ResourcePool("cpus", ["cpu", "cpu"])
    try:
        ranks = cluster.add_role(cluster.spawn_pool(pool, use_gpu=False), "reward", DeviceWorker, pool).where()
    finally:
        cluster.shutdown()
    assert [r["products"] for r in ranks] == ["blas", "blas"]
    assert [r["kernels"] for r in ranks] == ["off", "off"]


def test_a_result_over_streamed_chunks_is_cut_back_to_each_chunk_without_leaving_the_store(ray_cluster):
    """Old log-probs over a streamed step: the DP call's pieces cover every chunk's rows at the
    joined widths; joined onto the chunks, each chunk gets its rows of every rank's piece (a
    `Cut`), and the next call and the controller's reads see what the eager join gives."""
    from chunk_workers import RowsWorker

    from hflow.engine import columns as col
    from hflow.engine.groups.ray_backend import RayCluster
    from hflow.engine.groups.ray_futures import ChunkedFuture
    from hflow.engine.groups.worker import ResourcePool

    cluster = RayCluster(None, worker_timeout_s=60)
    pool = ResourcePool("rows", ["cpu:0", "cpu:1"])
    try:
        group = cluster.add_role(cluster.spawn_pool(pool, use_gpu=False), "reward", RowsWorker, pool)
        widths = [(3, 2), (2, 5), (4, 3)]  # each chunk's own prompt and response widths
        chunks = [group.make(Batch({"row": torch.arange(4 * k, 4 * k + 4)}, meta={"widths": w}))
                  for k, w in enumerate(widths)]
        step = ChunkedFuture(chunks, pad_token_id=0)
        scored = step | group.score(step)
        assert isinstance(scored, ChunkedFuture)  # no rows were pulled to the controller
        assert all(p.local is None for c in scored.chunks for parts in c.parts for p in parts)
        view = scored.select("row", col.OLD_LOG_PROBS)
        assert view["row"].tolist() == list(range(12))  # the step's rows, in chunk order
        want = torch.zeros(12, 5)  # row r's tokens r + t / 100, up to its chunk's response width
        for r in range(12):
            want[r, :widths[r // 4][1]] = r + torch.arange(widths[r // 4][1]) / 100
        assert torch.equal(view[col.OLD_LOG_PROBS], want)
        # The next call: rank 0 joins rows 0-1, 4-5, 8-9 with their scores (rank 1 the others).
        totals = group.total(scored).get()
        assert totals["row"].tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
        assert torch.allclose(totals["total"], want.sum(-1)[totals["row"]])
        # Pulling both to the controller and joining them there gets the rows wrong on 2 ranks
        # (the result is in rank order): what the cut replaces.
        pulled = step.get() | group.score(step).get()
        assert not torch.equal(pulled[col.OLD_LOG_PROBS], want)
    finally:
        cluster.shutdown()


def test_zero3_on_two_ranks_shards_the_reference_and_trains(ray_cluster, tiny_model, tmp_path):
    """Under ZeRO-3 the reference and the actor are both partitioned over the pool's two ranks: at the
    first step both score the same initial weights, so their KL is 0, and the run trains on."""
    recipe = _recipe(tiny_model, actor={"zero_stage": 3}, cluster={"cpu_slots": 2}, grpo={"kl_coef": 0.05},
                     trainer={"total_steps": 2},
                     placement={"backend": "ray", "mode": "explicit", "pools": {"dp": 2},
                                "roles": {"actor": "dp", "reference": "dp", "reward": "dp"}})
    _, events = _train_events(recipe, tmp_path, "zero3")
    assert [e["step"] for e in events] == [1, 2]
    assert events[0]["kl/mean"] == pytest.approx(0.0, abs=1e-6)
    assert events[1]["kl/mean"] > 1e-6  # the policy moved away from the (sharded) reference
