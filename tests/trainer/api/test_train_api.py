"""hflow from Python (issue #32): a user's own rows and reward function, trained and evaluated
with `hflow.train` / `hflow.evaluate`, learn as the command line does; bad arguments are one
line (`UserError`), and a run started with a Python function says how to resume it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import hflow
from hflow.engine.kernels.product_route import parse_route
from hflow.engine.cpu_threads import SHRINKING_TEAM_SPIN
from hflow.engine.host_memory import TRIM_THRESHOLD
from hflow.errors import UserError
from hflow.trainer.api.sources import _Weighted, dataset_file, reward_spec


def digits_share(prompts, responses, **columns):
    """The user's reward: the share of digits among the first 8 characters."""
    assert len(columns["answer"]) == len(responses)  # every column, one entry per response
    return [sum(c.isdigit() for c in r[:8]) / 8 for r in responses]


ROWS = [{"prompt": "make digits: ", "answer": str(i)} for i in range(64)]


def test_train_from_python_learns_and_evaluates(tmp_path, tiny_model):
    environment = dict(os.environ)
    run = hflow.train("grpo/quickstart", dataset=ROWS, reward=digits_share, output_dir=tmp_path / "runs",
                      overrides={"model.path": str(tiny_model), "model.init": None, "trainer.total_steps": 30,
                                 "trainer.save_every": 0})
    assert isinstance(run, hflow.Run) and run.status == "finished" and run.error is None
    # The run's choice of CPU product kernels is the run's: the caller's environment is given back.
    assert parse_route(json.loads((run.path / "plan.json").read_text())["cpu_products"]) is not None
    assert os.environ.get("HFLOW_CPU_PRODUCTS") == environment.get("HFLOW_CPU_PRODUCTS")
    steps = run.metrics
    assert [e["step"] for e in steps] == list(range(1, 31))
    first, last = (sum(e["reward/mean"] for e in part) / len(part) for part in (steps[:3], steps[-5:]))
    assert last > first + 0.2, (first, last)
    assert (run.final_model / "config.json").is_file()
    recipe = (run.path / "recipe.yaml").read_text()
    assert "python:digits_share" in recipe and "datasets/dataset-" in recipe  # the rows, written once
    eval_set = {"data.eval": "synthetic:digits", "data.eval_size": 16}
    metrics = hflow.evaluate(run.path / "recipe.yaml", run.path, overrides=eval_set)
    assert metrics["eval/reward"] > first
    # The trained model against the base on the same prompts and seeds: its side is `evaluate`'s
    # figure, and the paired interval of the gain excludes 0; a model against itself differs by 0.
    rows = {row.metric: row for row in hflow.compare(run.path / "recipe.yaml", run.path, "base", overrides=eval_set)}
    reward = rows["eval/reward"]
    assert reward.a == pytest.approx(metrics["eval/reward"]) and reward.prompts == 16
    assert reward.b < reward.a and 0 < reward.low <= reward.difference <= reward.high, reward
    for row in hflow.compare(run.path / "recipe.yaml", run.path, run.path, overrides=eval_set):
        assert row.a == row.b and row.difference == row.low == row.high == 0, row


def test_the_rows_are_written_once_by_their_content(tmp_path):
    one, again = dataset_file(ROWS, tmp_path), dataset_file(list(ROWS), tmp_path)
    assert one == again and [json.loads(line) for line in one.read_text().splitlines()] == ROWS
    assert dataset_file(ROWS[:3], tmp_path) != one


@pytest.mark.parametrize("kwargs, needle", [
    ({"dataset": ["make digits: "]}, "dataset row 0: a row is a dict"),
    ({"dataset": []}, "dataset: it has no rows"),
    ({"dataset": [{"prompt": "p", "x": object()}]}, "dataset row 0: cannot be written as JSON"),
    ({"reward": [digits_share, digits_share], "reward_weights": [1.0]}, "1 weights for 2 reward functions"),
    ({"reward_weights": [1.0]}, "reward_weights: give the reward functions"),
    ({"overrides": ["trainer.total_steps=5"]}, "overrides: give a dict of dotted keys"),
    ({"overrides": {"trainer.max_steps": 5}}, "hflow's key is 'trainer.total_steps'"),
])
def test_bad_arguments_are_one_line(tmp_path, kwargs, needle):
    with pytest.raises(UserError, match=None) as err:
        hflow.train("grpo/quickstart", output_dir=tmp_path, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_several_rewards_are_summed_with_their_weights():
    combined = _Weighted([digits_share, lambda p, r, **c: [1.0] * len(r)], [2.0, -0.5])
    assert combined(["p", "p"], ["12ab", "abcd"], answer=["", ""]) == [2 * 2 / 8 - 0.5, -0.5]
    assert reward_spec("synthetic", None) == "synthetic"


def test_a_python_reward_named_in_another_process_says_how_to_resume():
    from hflow.trainer.data.rewards import load_reward_fn

    with pytest.raises(UserError, match="handed to hflow.train in another process"):
        load_reward_fn("python:score_from_yesterday")


def test_a_python_reward_run_resumes_from_python_exactly(tmp_path, tiny_model):
    """Crashed after step 5 of 6 (the checkpoint at 6 never written): the command line cannot give
    the function again and says so in one line; `hflow.train(resume=..., reward=fn)` continues, and
    steps 4-6 are the uninterrupted run's."""
    from helpers import assert_one_line_error, crashed, run_hflow

    run = hflow.train("grpo/quickstart", dataset=ROWS, reward=digits_share, output_dir=tmp_path / "runs",
                      overrides={"model.path": str(tiny_model), "model.init": None, "trainer.total_steps": 6,
                                 "trainer.save_every": 3})
    whole = run.metrics
    shutil.rmtree(run.path / "checkpoints" / "step_000006")
    (run.path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in whole[:5]))
    crashed(run.path, 5)
    assert_one_line_error(run_hflow("train", "--resume", str(run.path)), "reward.function", "python:digits_share",
                          "give it again")
    again = hflow.train(resume=run.path, reward=digits_share)
    assert again.status == "finished" and [e["step"] for e in again.metrics] == [1, 2, 3, 4, 5, 6]
    for before, after in zip(whole[3:], again.metrics[3:]):
        for key in ("reward/mean", "actor/loss", "actor/grad_norm"):
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)


@pytest.mark.slow
def test_a_notebook_function_reaches_ray_workers(tmp_path, tiny_model):
    """A reward defined in `__main__` (a script, a notebook) is pickled by value to the reward
    worker on the ray backend (quickstart_ray_split: the reward on a Ray worker of its own pool)."""
    import subprocess
    import sys

    (tmp_path / "script.py").write_text(
        "import hflow\n"
        "def score(prompts, responses, **columns):\n"
        "    return [sum(c.isdigit() for c in r[:8]) / 8 for r in responses]\n"
        f"run = hflow.train('grpo/quickstart_ray_split', reward=score, output_dir='runs', overrides={{\n"
        f"    'model.path': {str(tiny_model)!r}, 'model.init': None, 'trainer.total_steps': 2,\n"
        "    'trainer.save_every': 0})\n"
        "print(run.status, run.path)\n")
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    status, path = done.stdout.strip().splitlines()[-1].split()
    assert status == "finished"
    run = hflow.Run(tmp_path / path)
    assert [e["step"] for e in run.metrics] == [1, 2]
    assert "python:score" in (run.path / "recipe.yaml").read_text()
    assert json.loads((run.path / "plan.json").read_text())["backend"] == "ray"


@pytest.mark.parametrize("kind", ["pandas", "datasets"])
def test_a_data_frame_or_a_dataset_gives_the_same_rows(kind):
    from hflow.trainer.api.sources import rows_of

    if kind == "pandas":
        pandas = pytest.importorskip("pandas")
        table = pandas.DataFrame(ROWS)
    else:
        datasets = pytest.importorskip("datasets")
        table = datasets.Dataset.from_list(ROWS)
    assert rows_of(table) == ROWS


# What the process environment holds when torch is first imported, seen by an import hook.
AT_TORCH_IMPORT = """
import json, os, sys
KEYS = ("GOMP_SPINCOUNT", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "THP_MEM_ALLOC_ENABLE")
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.update({key: os.environ.get(key) for key in KEYS})
        return None
sys.meta_path.insert(0, Spy())
import hflow
hflow.train
print(json.dumps(seen))
"""


def test_a_run_from_python_gets_the_commands_process_settings_before_torch_loads():
    """libgomp and torch read their settings once, as they load: `hflow.train` makes them first, as
    the command does, so a run from Python is as fast as `hflow train` (a user's own value wins)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MALLOC_MMAP_MAX_",
                        "MALLOC_TRIM_THRESHOLD_", "THP_MEM_ALLOC_ENABLE")}
    for user, expected_thp in (({}, None), ({"THP_MEM_ALLOC_ENABLE": "1"}, "1")):  # huge pages: the user's
        done = subprocess.run([sys.executable, "-c", AT_TORCH_IMPORT], env={**env, **user}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen == {"GOMP_SPINCOUNT": SHRINKING_TEAM_SPIN, "MALLOC_MMAP_MAX_": "0",
                        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD), "THP_MEM_ALLOC_ENABLE": expected_thp}
