"""The thread count of a local run's process (`trainer/placement/cpu_share.py`): one thread for a
small model, the cores other processes left free otherwise, the user's OMP_NUM_THREADS untouched;
the arithmetic on a written /proc/stat, and one real check beside spinning processes."""

import functools
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from hflow.trainer.placement.cpu_share import SMALL_MODEL_PARAMS, CpuShare

CPUS = sorted(os.sched_getaffinity(0))


class FakeMachine:
    """A /proc/stat whose per-CPU busy ticks, the process's own CPU seconds and the clock move
    as a test says: `advance(seconds, busy_cores, own_cores)`."""

    def __init__(self, path):
        self.path, self.ticks, self.own, self.now = path, 0, 0.0, 0.0
        self.hz = os.sysconf("SC_CLK_TCK")
        self.write()

    def write(self):
        idle = 10_000_000
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{i} {self.ticks // len(CPUS)} 0 0 {idle} 0 0 0 0 0 0" for i in CPUS]
        self.path.write_text("\n".join(lines) + "\nintr 0\n")

    def advance(self, seconds: float, busy_cores: float, own_cores: float):
        self.now += seconds
        self.own += own_cores * seconds
        n = len(CPUS)  # the busy ticks spread evenly over the CPUs; their sum is what counts
        self.ticks += round((busy_cores + own_cores) * seconds * self.hz / n) * n
        self.write()

    def share(self, params, environ=None, on=True, compute_threads=1):
        return CpuShare(params, on=on, compute_threads=compute_threads, environ=environ or {}, stat_path=str(self.path),
                        own_cpu_s=lambda: self.own, wall_s=lambda: self.now)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs in the affinity mask")
def test_the_process_takes_the_cores_others_left_free_and_its_own_use_does_not_count(tmp_path, two_threads):
    machine = FakeMachine(tmp_path / "stat")
    share = machine.share(params=5 * SMALL_MODEL_PARAMS)
    machine.advance(2.0, busy_cores=0.0, own_cores=2.0)  # the process itself used both cores
    assert share.before_step() == {"cpu/threads": 2.0, "cpu/others_cores": 0.0}
    assert torch.get_num_threads() == 2
    machine.advance(2.0, busy_cores=1.0, own_cores=1.0)  # another process took a core
    assert share.before_step() == {"cpu/threads": 1.0, "cpu/others_cores": 1.0}
    assert torch.get_num_threads() == 1
    machine.advance(2.0, busy_cores=0.3, own_cores=1.0)  # it went away (mostly)
    assert share.before_step()["cpu/threads"] == 2.0
    machine.advance(2.0, busy_cores=len(CPUS) + 1.0, own_cores=0.5)  # every core taken: still one
    assert share.before_step()["cpu/threads"] == 1.0
    share.restore()
    assert torch.get_num_threads() == 2


def test_a_model_under_a_million_parameters_runs_on_one_thread(tmp_path, two_threads):
    machine = FakeMachine(tmp_path / "stat")
    share = machine.share(params=SMALL_MODEL_PARAMS - 1)
    machine.advance(1.0, busy_cores=0.0, own_cores=1.0)
    assert share.before_step()["cpu/threads"] == 1.0 and torch.get_num_threads() == 1
    share.restore()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("case", ["user set OMP_NUM_THREADS", "not a local CPU run", "no /proc/stat"])
def test_the_count_is_left_alone(tmp_path, two_threads, case):
    machine = FakeMachine(tmp_path / "stat")
    if case == "user set OMP_NUM_THREADS":
        share = machine.share(params=1000, environ={"OMP_NUM_THREADS": "2"})
    elif case == "not a local CPU run":
        share = machine.share(params=1000, on=False)
    else:
        machine.path.unlink()
        share = machine.share(params=1000)
    machine.advance(1.0, busy_cores=2.0, own_cores=0.0)
    assert share.before_step() == {}
    assert torch.get_num_threads() == 2
    share.restore()
    assert torch.get_num_threads() == 2


@pytest.mark.skipif(not os.path.exists("/proc/stat") or len(CPUS) < 2, reason="needs Linux and two CPUs")
def test_beside_processes_spinning_on_every_core_the_next_step_runs_on_one_thread(two_threads):
    """The real /proc/stat: spinning processes on every core of the affinity mask are seen."""
    share = CpuShare(params=5 * SMALL_MODEL_PARAMS, environ={})
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in CPUS]
    try:
        time.sleep(1.5)
        metrics = share.before_step()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert metrics["cpu/others_cores"] > len(CPUS) - 1  # about len(CPUS); the test process sleeps
    assert metrics["cpu/threads"] == 1.0 and torch.get_num_threads() == 1
    share.restore()


@pytest.mark.skipif(len(CPUS) != 2, reason="the halves are worked out for two CPUs")
def test_two_compute_threads_take_half_the_free_cores_each_and_set_their_own_count(tmp_path, two_threads):
    """Async mode on the local backend: the generator thread and the controller's get one core
    each; a thread's count is its own (OpenMP's), so the generator sets it with `apply()`."""
    machine = FakeMachine(tmp_path / "stat")
    share = machine.share(params=5 * SMALL_MODEL_PARAMS)
    share_async = machine.share(params=5 * SMALL_MODEL_PARAMS, compute_threads=2)
    assert share_async.threads == 1  # before the first look too: the generator may start first
    machine.advance(1.0, busy_cores=0.0, own_cores=2.0)
    assert share.before_step()["cpu/threads"] == 2.0
    assert share_async.before_step()["cpu/threads"] == 1.0 and torch.get_num_threads() == 1
    seen = []

    def generator():
        seen.append(torch.get_num_threads())  # started while the main thread had 1: inherits it
        torch.set_num_threads(2)
        share_async.apply()
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=generator)
    thread.start()
    thread.join()
    assert seen == [1, 1]
    share_async.restore()
    assert torch.get_num_threads() == 2


def test_evaluation_generates_on_the_thread_share_and_gives_the_threads_back(tiny_model, two_threads, monkeypatch):
    """`hflow eval` on a local CPU: as a training step, the model's share of the cores while it
    generates (the tiny model's: one thread), the process's own count afterwards."""
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.control import evaluate

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    outcomes = evaluate.Evaluator.outcomes

    def spy(self, actor, reward, step):
        seen.append(torch.get_num_threads())
        return outcomes(self, actor, reward, step)

    monkeypatch.setattr(evaluate.Evaluator, "outcomes", spy)
    recipe, _ = load_recipe("grpo/quickstart", [f"model.path={tiny_model}", "model.init=null",
                                                "data.eval=synthetic:digits", "data.eval_size=8"])
    scored = evaluate.evaluate_outcomes(recipe, None, step=0)
    assert seen == [1] and torch.get_num_threads() == 2
    assert len(next(iter(scored.values()))["accuracy"]) == 8  # every held-out prompt scored


def test_bench_rollout_generates_on_the_thread_share_and_gives_the_threads_back(tiny_model, two_threads, monkeypatch):
    """`hflow bench rollout` on a local CPU times its rollouts as a training step runs them: on the
    model's share of the cores (the tiny model's: one thread), the process's own count afterwards."""
    from hflow.engine.workers.actor import ActorWorker
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import bench_rollout

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    generate = ActorWorker.generate_sequences

    @functools.wraps(generate)  # keeps its registration as a worker method
    def spy(self, batch):
        seen.append(torch.get_num_threads())
        return generate(self, batch)

    monkeypatch.setattr(ActorWorker, "generate_sequences", spy)
    recipe, _ = load_recipe("grpo/quickstart", [f"model.path={tiny_model}", "model.init=null"])
    measured = bench_rollout(recipe, repeats=2)
    assert seen == [1, 1, 1] and measured["threads"] == 1  # the warm-up and both timed rollouts
    assert torch.get_num_threads() == 2
