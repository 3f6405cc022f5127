"""The new user's path (issue #32), end to end on the tiny model from the command line: their own
JSON Lines prompts, their own reward module beside their own recipe, `validate`, `train` from
another folder, `runs`, `eval` of the run folder. It must learn. (The same from Python:
tests/trainer/api/test_train_api.py.)"""

import json
import textwrap

import pytest

from helpers import read_events, run_hflow

RECIPE = """
name: mine
algorithm: grpo
model:
  path: {model}
data:
  train: prompts.jsonl
  eval: held_out.jsonl
reward:
  function: my_reward:score
rollout:
  n: 8
  max_response_length: 12
actor:
  lr: 0.002
  mini_batch_size: 32
  micro_batch_size: 16
trainer:
  total_steps: 30
  prompts_per_step: 8
  save_every: 10
  output_dir: runs
"""

REWARD = textwrap.dedent('''
    def score(prompts, responses, **columns):
        """The share of digits among the first 8 characters, as much as the row's `weight` says."""
        return [w * sum(c.isdigit() for c in r[:8]) / 8 for r, w in zip(responses, columns["weight"])]
''')


@pytest.mark.slow
def test_own_data_reward_and_recipe_from_validate_to_eval(tmp_path, tiny_model):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "my.yaml").write_text(RECIPE.format(model=tiny_model))
    (project / "my_reward.py").write_text(REWARD)
    rows = [{"prompt": "make digits: ", "weight": 1.0} for _ in range(64)]
    (project / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (project / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))

    assert run_hflow("validate", "proj/my.yaml", cwd=tmp_path).returncode == 0
    result = run_hflow("train", "proj/my.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / result.stdout.strip().splitlines()[-1]
    events = read_events(run)
    first, last = (sum(e["reward/mean"] for e in part) / len(part) for part in (events[:5], events[-5:]))
    assert last > first + 0.2, (first, last)

    listed = run_hflow("runs", "runs", cwd=tmp_path)
    assert "mine" in listed.stdout and "finished" in listed.stdout
    scored = run_hflow("eval", "proj/my.yaml", "--checkpoint", str(run), cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-2000:]
    # each line: KEY VALUE, then its 95% interval ("95% LOW-HIGH")
    printed = dict(line.split()[:2] for line in scored.stdout.splitlines() if line.startswith("eval/"))
    assert float(printed["eval/reward"]) > first
