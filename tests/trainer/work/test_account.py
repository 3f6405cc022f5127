"""A training run's events carry each phase's work account: PPO with a reward model and a critic
has every phase of the step, each needing work and having computed at least that."""

import pytest

from helpers import train_run, write_recipe

PPO_PHASES = {"generate", "old_log_prob", "reference", "values", "reward", "update_critic", "update_actor"}


@pytest.fixture(scope="module")
def tiny_scorer(tmp_path_factory):
    """An untrained tiny reward model (a sequence classifier with the tiny tokenizer): it only has
    to run."""
    from hflow.engine.models.loading import build_tiny_score_model

    out = tmp_path_factory.mktemp("models") / "tiny-scorer"
    model, tokenizer = build_tiny_score_model()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.slow
def test_events_carry_every_phases_needed_and_computed_work(tmp_path, tiny_model, tiny_scorer):
    recipe = write_recipe(tmp_path / "ppo.yaml", tiny_model, algorithm="ppo", reward={"model": str(tiny_scorer)},
                          critic={"mini_batch_size": 16, "micro_batch_size": 16},
                          trainer={"total_steps": 2, "save_every": 0})
    _, events = train_run(recipe)
    for event in events:
        phases = {key.split("/")[1] for key in event if key.startswith("work/")}
        assert phases == PPO_PHASES, event["step"]
        for phase in phases:
            needed, computed = event[f"work/{phase}/needed_flops"], event[f"work/{phase}/computed_flops"]
            assert 0 < needed <= computed, (phase, needed, computed)
            assert event[f"work/{phase}/needed_bytes"] > 0
        # the update is a forward and a backward (3x) of what the scoring pass needed
        assert event["work/update_actor/needed_flops"] == pytest.approx(3 * event["work/old_log_prob/needed_flops"])
        assert event["work/reference/needed_flops"] == event["work/old_log_prob/needed_flops"]  # same model


def test_work_done_ahead_is_reported_by_the_step_it_was_done_for():
    """Async mode's generator counts its work under the step it generates for (`work_meter.for_step`):
    the step that uses the rollout reports it, whichever step's event took it from the meter."""
    from hflow.engine import work_meter
    from hflow.trainer.work.account import step_counts

    def gen(tokens):
        return {"actor": {"tokens": tokens, "keys": 1}}

    ahead: dict = {}
    # step 5's event: its own update, the end of step 5's generation and the start of step 6's
    taken = {"update_actor": gen(7), work_meter.for_step("generate", 5): gen(10),
             work_meter.for_step("generate", 6): gen(3)}
    assert step_counts(taken, 5, ahead) == {"update_actor": gen(7), "generate": gen(10)}
    assert ahead == {6: {"generate@6": gen(3)}}
    # step 6's event: the rest of step 6's generation; its first part comes back from `ahead`
    taken = {work_meter.for_step("generate", 6): gen(5), "update_actor": gen(7)}
    assert step_counts(taken, 6, ahead) == {"generate": {"actor": {"tokens": 8, "keys": 2}}, "update_actor": gen(7)}
    assert ahead == {}
    # without a step (or for work of a step already reported) everything counts now
    assert step_counts({"generate@2": gen(1), "generate": gen(1)}, None, {}) == {
        "generate": {"actor": {"tokens": 2, "keys": 2}}}
    assert work_meter.of_step("generate@12") == ("generate", 12) and work_meter.of_step("eval") == ("eval", None)


def test_the_peaks_are_the_best_of_passes_taken_apart(monkeypatch):
    """Each product's rate and the bandwidth are measured once per pass, every product in a pass
    before the next pass begins, and the best of the passes is kept: a pass that met the machine
    in a slow state does not set the limit."""
    import torch

    from hflow.trainer.work import bench_account

    calls = []
    measured = {(1024, 1024, 1024): iter([400.0, 450.0, 420.0]), (32, 576, 1536): iter([250.0, 330.0, 260.0])}
    bandwidths = iter([46.0, 77.0, 45.0])
    monkeypatch.setattr(bench_account, "matmul_rate", lambda m, k, n, device, dtype: calls.append((m, k, n)) or
                        next(measured[(m, k, n)]))
    monkeypatch.setattr(bench_account, "copy_bandwidth", lambda device: calls.append("copy") or next(bandwidths))
    rates, bandwidth = bench_account.best_peaks([(1024, 1024, 1024), (32, 576, 1536)], torch.device("cpu"),
                                                torch.float32)
    assert rates == {(1024, 1024, 1024): 450.0, (32, 576, 1536): 330.0} and bandwidth == 77.0
    assert bench_account.RATE_PASSES == 3 and calls == [(1024, 1024, 1024), (32, 576, 1536), "copy"] * 3


def test_the_minimum_memory_counts_the_logits_of_the_scored_positions_only(tmp_path, tiny_model):
    """hflow runs the LM head on the response's positions only: the update's and the scoring pass's
    least memory count those positions' logits (float32, and in the update their gradient), not the
    prompt's. A run whose peak sat below the old minimum (SmolLM2, micro-batches of 32 rows: 4,544
    MiB measured, 4,886 "needed") showed the account counting logits it never computes."""
    from hflow.mapper.models import shape_from_config
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench_account import minimum_memory

    recipe = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_model)), [])[0]
    shape = shape_from_config(tiny_model / "config.json")
    micro = recipe.actor.micro_batch_size
    for phase, gradient in (("update_actor", 2), ("old_log_prob", 1)):
        whole = minimum_memory(phase, "actor", shape, recipe, 30.0, 4)
        scored = minimum_memory(phase, "actor", shape, recipe, 30.0, 4, scored_per_row=12.0)
        assert whole[0] == scored[0]  # weights and optimizer state
        assert whole[1] - scored[1] == micro * (30 - 12) * shape.vocab * 4 * gradient


def test_a_prompt_counts_once_for_its_group_in_the_least_memory():
    """Rows of 30 tokens, 12 of them the response, in groups of 4 sharing an 18-token prompt: each
    needs 12 + 18 / 4 tokens of its own; without a response length, the whole row."""
    from hflow.trainer.work.bench_account import distinct_row_tokens

    assert distinct_row_tokens(30.0, 12.0, 4) == 16.5
    assert distinct_row_tokens(30.0, 12.0, 1) == 30.0
    assert distinct_row_tokens(30.0, None, 4) == 30.0


def test_a_phases_limit_adds_its_parts_limits():
    """Parts run one after another (a decoding step waits for the last one's token), so each takes
    the larger of its FLOPs at the rate and its bytes at the bandwidth, and the phase their sum: a
    step of few live rows reads the weights with little to hide the reads behind. Each pass may
    find a cache's worth of its bytes still on chip."""
    from hflow.trainer.work.bench_account import phase_limit
    from hflow.trainer.work.needed import Part, whole

    parts = {"prefill": Part(100.0, 10.0, 1), "decode_32": Part(2000.0, 100.0, 10), "decode_1": Part(10.0, 100.0, 10)}
    # prefill at its own rate 20: max(5, 10); the wide steps max(200, 100); the narrow ones max(1, 100)
    assert phase_limit(parts, rate=10.0, prefill_rate=20.0, bandwidth=1.0, cache=0.0) == (10 + 200 + 100, 10 + 100)
    flops, nbytes = whole(parts)
    assert max(flops / 10.0, nbytes / 1.0) == 211.0  # the whole phase as one part: a lower limit
    # 5 bytes kept on chip per pass: prefill max(5, 5), the wide steps max(200, 50), narrow max(1, 50)
    assert phase_limit(parts, 10.0, 20.0, 1.0, cache=5.0) == (5 + 200 + 50, 50)
    # a cache that holds each pass's bytes: every part at its FLOPs
    assert phase_limit(parts, 10.0, 20.0, 1.0, cache=10.0) == (5 + 200 + 1, 0)


def test_the_limit_is_the_median_of_each_steps_parts(monkeypatch):
    """Each step's limit from its own parts (a step's decoding steps by live rows differ), the
    median of those; a step logged as one pass counts its totals."""
    from hflow.trainer.work.account import part_metrics
    from hflow.trainer.work.bench_account import part_times, phase_line
    from hflow.trainer.work.needed import Part

    def event(parts, seconds):
        flops, nbytes = sum(p.flops for p in parts.values()), sum(p.nbytes for p in parts.values())
        return {"work/generate/needed_flops": flops, "work/generate/needed_bytes": nbytes,
                "timing/generate": seconds, **part_metrics("generate", parts)}

    events = [event({"prefill": Part(40.0, 0.0), "decode_1": Part(10.0, 300.0, 3)}, 1.0),
              event({"prefill": Part(40.0, 0.0), "decode_2": Part(20.0, 100.0, 1)}, 2.0),
              {"work/generate/needed_flops": 500.0, "work/generate/needed_bytes": 0.0, "timing/generate": 3.0}]
    line = phase_line(events, "generate", 10.0, lambda parts: part_times(parts, 10.0, 20.0, 1.0, 0.0), {})
    # limits: 2 + 300 (memory-bound), 2 + 100 (memory-bound), 50 (one pass, compute-bound)
    assert line["limit_s"] == 102.0 and line["memory_bound_s"] == 100.0 and line["bound"] == "memory"
    assert line["measured_s"] == 2.0 and line["share_of_limit"] == 51.0
    # each part's medians over the three steps, 0 where it did not run
    assert line["parts"]["decode_1"] == {"needed_flops": 0.0, "needed_bytes": 0.0, "passes": 0, "limit_s": 0.0,
                                         "bound": "compute"}
    assert line["parts"]["prefill"]["limit_s"] == 2.0 and line["parts"]["decode_2"]["passes"] == 0
    assert set(line["parts"]) == {"prefill", "decode_1", "decode_2", "pass"}


def test_the_caches_of_the_cores_count_once_each(tmp_path):
    """Two cores, each with its own level 1 and 2 caches, sharing a level 3: instruction caches
    hold no data, a shared cache counts once."""
    import torch

    from hflow.trainer.work.bench_account import cache_bytes

    for cpu in (0, 1):
        for index, (level, kind, size, shared) in enumerate(
                [(1, "Data", "48K", str(cpu)), (1, "Instruction", "32K", str(cpu)), (2, "Unified", "1024K", str(cpu)),
                 (3, "Unified", "32768K", "0-1")]):
            d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            d.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (d / name).write_text(f"{value}\n")
    assert cache_bytes(torch.device("cpu"), [0, 1], str(tmp_path)) == 2 * (48 << 10) + 2 * (1 << 20) + (32 << 20)
    assert cache_bytes(torch.device("cpu"), [1], str(tmp_path)) == (48 << 10) + (1 << 20) + (32 << 20)
    assert cache_bytes(torch.device("cpu"), [0], str(tmp_path / "absent")) == 0.0
