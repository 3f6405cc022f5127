"""The tests' forked commands (tests/zygote.py) answer as fresh processes do: the same run, the same
streams and exit codes; a setting read at start-up sends the command to a fresh process."""

import json
import re
import subprocess

import pytest

import zygote
from helpers import RUN_VARYING, assert_same_events, fresh_hflow, read_events

ONE_STEP = ("--set", "trainer.total_steps=1", "--set", "trainer.save_every=1")


def _masked(text: str, *runs) -> list[str]:
    """The lines of `text` with each run's folder named alike and the times left out."""
    for k, run in enumerate(runs):
        text = text.replace(str(run), f"<run{k}>").replace(run.name, f"<run{k}>")
    return [re.sub(r"s/step \S+|eta \S+|in \d+:\d\d:\d\d", "<time>", line) for line in text.splitlines()]


@pytest.mark.slow
def test_a_forked_train_runs_writes_and_answers_as_a_fresh_process(tmp_path):
    env = dict(zygote.BASE)
    server = zygote.shared()
    args = ("train", "grpo/quickstart", *ONE_STEP)
    assert server.takes(args, env)
    runs = []
    for name, run in (("fresh", fresh_hflow), ("forked", lambda *a: server.run(*a, timeout=600))):
        (tmp_path / name).mkdir()
        done = run(args, tmp_path / name, env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append((done, tmp_path / name / done.stdout.strip().splitlines()[-1]))
    (fresh, fresh_run), (forked, forked_run) = runs
    assert_same_events(read_events(fresh_run), read_events(forked_run), RUN_VARYING,
                       required=("reward/mean", "actor/loss"))
    assert _masked(forked.stdout, forked_run) == _masked(fresh.stdout, fresh_run)
    assert _masked(forked.stderr, forked_run) == _masked(fresh.stderr, fresh_run)
    for name in ("status.json", "trainer_state.json"):
        assert (fresh_run / name).exists() == (forked_run / name).exists()
    assert json.loads((forked_run / "status.json").read_text())["status"] == "finished"

    # A user's mistake found after torch has loaded: one line, exit 2, in both.
    (fresh_run / "train.log").unlink()
    (fresh_run / "train.log").symlink_to(tmp_path / "elsewhere.txt")
    bad = ("train", "--resume", str(fresh_run), "--set", "trainer.total_steps=2")
    answers = [fresh_hflow(bad, tmp_path, env), server.run(bad, tmp_path, env, timeout=600)]
    assert [a.returncode for a in answers] == [2, 2]
    assert answers[0].stderr == answers[1].stderr and answers[0].stdout == answers[1].stdout
    assert "is a symbolic link" in answers[1].stderr


def test_a_command_past_its_timeout_is_killed_and_the_server_goes_on(tmp_path):
    server = zygote.shared()
    args = ("train", "grpo/quickstart", *ONE_STEP, "--set", f"trainer.output_dir={tmp_path}")
    assert server.takes(args, dict(zygote.BASE))
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(args, tmp_path, dict(zygote.BASE), 0.05)
    bad = server.run(("eval", str(tmp_path / "missing.yaml")), tmp_path, dict(zygote.BASE), 600)
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr


def test_only_train_and_eval_without_start_up_settings_of_their_own_are_forked():
    base = {"PATH": "/bin", "GOMP_SPINCOUNT": "10000"}
    preloaded = {**base, "TQDM_DISABLE": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32"}
    assert zygote.eligible(("train", "r.yaml"), base, base, preloaded)
    assert zygote.eligible(("eval", "r.yaml"), base, base, preloaded)
    for command in (("validate", "r.yaml"), ("map", "r.yaml"), ("init-model", "tiny", "m"), ()):
        assert not zygote.eligible(command, base, base, preloaded)
    # Read after start-up (recipe keys, wandb's, the test's name), or what the imports set themselves.
    for later in ({"HFLOW_ACTOR__LR": "0.1"}, {"WANDB_MODE": "offline"}, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32"},
                  {"MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "1"}, {"RAY_AUTH_TOKEN": "t"},
                  {"PYTHONBREAKPOINT": "0"}):
        assert zygote.eligible(("train", "r.yaml"), {**base, **later}, base, preloaded), later
    # Read when a library loads: threads, host memory, the imports' own settings changed, PATH.
    for start in ({"OMP_NUM_THREADS": "1"}, {"MALLOC_ARENA_MAX": "2"}, {"GOMP_SPINCOUNT": "0"},
                  {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}, {"HF_HUB_OFFLINE": "1"}, {"PATH": "/usr/bin"},
                  {zygote.FRESH: "1"}):
        assert not zygote.eligible(("train", "r.yaml"), {**base, **start}, base, preloaded), start
    assert not zygote.eligible(("train", "r.yaml"), {"GOMP_SPINCOUNT": "10000"}, base, preloaded)  # PATH removed
