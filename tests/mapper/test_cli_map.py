"""`hflow map` through typer, on every shipped PPO recipe and on a GRPO recipe written here."""

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from hflow.cli.map import map as map_command

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes" / "ppo").glob("*.yaml"))
JSON_KEYS = {"placement", "gpus", "strategies", "estimated_iteration_s", "search_s", "candidates_evaluated"}


@pytest.fixture(scope="module")
def invoke():
    app = typer.Typer()
    app.command("map")(map_command)
    app.command("other")(lambda: None)  # two commands, so that `map` is a subcommand as in hflow's app
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["map", *map(str, args)])


def test_shipped_ppo_recipes_exist():
    assert {p.stem for p in RECIPES} >= {"llama2-7b", "llama2-13b", "llama2-70b", "codellama-34b"}


BELL = {1: 1, 2: 2, 3: 5, 4: 15, 5: 52}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_map_every_shipped_recipe(invoke, recipe, tmp_path, monkeypatch):
    from hflow.engine.models.loading import build_tiny_model
    from hflow.trainer.config.load import load_recipe

    loaded, _ = load_recipe(str(recipe))
    monkeypatch.chdir(tmp_path)  # local models a recipe's header says to build first: build them here
    for path in loaded.role_models().values():
        if path.startswith("models/"):
            build_tiny_model(tmp_path / path)
    # The auto-mapper examples hflow cannot train (their headers say so) fit only the paper's 3D plans.
    paper = ("--parallel", "3d") if "auto-mapper example only" in recipe.read_text() else ()
    result = invoke(recipe, *paper)
    assert result.exit_code == 0, result.output
    placements = BELL[len(loaded.role_models())]
    assert "best plan:" in result.stdout and "runners-up" in result.stdout
    assert f"searched {placements} placements" in result.stdout
    result = invoke(recipe, "--gpus", 128, "--json", *paper)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    _check_schema(plan, 128)


def _check_schema(plan: dict, gpus: int):
    assert JSON_KEYS <= set(plan)
    assert [len(group) for group in plan["placement"]] == [len(pool["roles"]) for pool in plan["pools"]]
    assert plan["gpus"] == [pool["devices"] for pool in plan["pools"]]
    assert sum(plan["gpus"]) <= gpus == plan["devices_total"]
    assert set(plan["strategies"]) == set(plan["roles"]) == {r for group in plan["placement"] for r in group}
    for role, entry in plan["roles"].items():
        assert role in next(p["roles"] for p in plan["pools"] if p["name"] == entry["pool"])
    assert plan["estimated_iteration_s"] == pytest.approx(sum(plan["stage_s"].values()), rel=1e-3)
    assert plan["search_s"] >= 0 and plan["candidates_evaluated"] > 0
    assert "generate" in plan["strategies"]["actor"] and "train" in plan["strategies"]["actor"]


def test_top_k_runners_up(invoke):
    plan = json.loads(invoke(RECIPES[0], "--gpus", 32, "--json", "--top", 5, "--parallel", "3d").stdout)
    assert len(plan["runners_up"]) == 5
    costs = [plan["estimated_iteration_s"]] + [r["estimated_iteration_s"] for r in plan["runners_up"]]
    assert costs == sorted(costs)
    assert len({json.dumps(r["placement"]) for r in plan["runners_up"]}) == 5  # distinct placements


def test_grpo_recipe(invoke, tmp_path):
    recipe = {"algorithm": "grpo", "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
              "data": {"train": "data/math.jsonl", "max_prompt_length": 512},
              "rollout": {"n": 8, "max_response_length": 1024}, "trainer": {"prompts_per_step": 64},
              "actor": {"mini_batch_size": 128, "micro_batch_size": 4},
              "cluster": {"gpus": 8, "gpu": "h100-80g"}, "placement": {"mode": "auto"}}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = invoke(path, "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    _check_schema(plan, 8)
    assert set(plan["roles"]) == {"actor", "reference"}  # GRPO: no critic, a reward function
    assert plan["device"] == "h100-80g"


@pytest.mark.parametrize("args, words", [
    (["--gpu", "v100"], ["unknown GPU type", "a100-80g"]),
    (["--gpus", 8, "--set", "model.path=someone/unknown"], ["not in the mapper's catalog", "config.json"]),
    (["--gpus", 16], ["does not fit", "actor", "16 a100-80g"]),
    (["--set", "trainer.prompt_per_step=3"], ["unknown key"]),
    (["--train-layout", "eight"], ["--train-layout"]),
])
def test_user_errors_are_one_line_on_stderr_exit_2(invoke, args, words):
    result = invoke(RECIPES[[p.stem for p in RECIPES].index("llama2-70b")], *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_cpu_slots_without_gpus(invoke, tmp_path):
    recipe = {"model": {"path": str(tmp_path / "tiny"), "init": "tiny"}, "data": {"train": "synthetic:add"}}
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(recipe))
    plan = json.loads(invoke(path, "--json").stdout)
    assert plan["device"] == "cpu" and "CPU worker slots" in plan["note"]
    assert plan["parallel"] == "zero"


def test_the_default_plans_what_hflow_train_runs_and_a_3d_plan_says_it_cannot(invoke):
    """The paper's search puts Llama-2-7B's actor on tensor x pipeline parallelism, which hflow's
    ZeRO engines cannot run: the default plans without it, and --parallel 3d marks its plan."""
    args = ("ppo/llama2-7b", "--gpus", 16, "--gpus-per-node", 8, "--gpu", "h100-80g")
    default = json.loads(invoke(*args, "--json").stdout)
    assert default["parallel"] == "zero"
    assert default["hflow_train"] == {"executable": True, "blocked_by": [], "needs": []}
    layouts = [s[k] for s in default["strategies"].values() for k in ("train", "infer") if k in s]
    assert layouts and all(layout["tp"] == layout["pp"] == 1 for layout in layouts)
    assert "not executable" not in invoke(*args).stdout
    paper = json.loads(invoke(*args, "--parallel", "3d", "--json").stdout)
    assert not paper["hflow_train"]["executable"]
    assert any(b.startswith("actor trains with tensor x pipeline parallelism") for b in paper["hflow_train"]["blocked_by"])
    assert paper["estimated_iteration_s"] < default["estimated_iteration_s"]  # faster on paper, not runnable
    assert "not executable by hflow train: actor trains with tensor x pipeline" in invoke(*args, "--parallel", "3d").stdout


def test_what_hflow_runs_of_hand_written_strategies():
    from hflow.mapper.plan import what_hflow_runs

    zero = {"train": {"tp": 1, "pp": 1}, "generate": {"tp": 1}}
    assert what_hflow_runs({"actor": zero}) == {"executable": True, "blocked_by": [], "needs": []}
    vllm_tp = {"train": {"tp": 1, "pp": 1}, "generate": {"tp": 4}}
    assert what_hflow_runs({"actor": vllm_tp}) == {
        "executable": True, "blocked_by": [],
        "needs": ["rollout.engine: vllm with rollout.tensor_parallel_size: 4 (actor)"]}
    assert not what_hflow_runs({"rollout": {"generate": {"tp": 2}}}, asynchronous=True)["executable"]
    assert what_hflow_runs({"reward": {"infer": {"tp": 1, "pp": 2}}})["blocked_by"] == [
        "reward runs with tensor x pipeline parallelism 1x2"]
