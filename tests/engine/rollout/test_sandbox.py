"""The bubblewrap sandbox against the hostile programs model-written code has been seen to be:
each one runs through the code tool (`run_python`, the default `bwrap` sandbox) and the test
checks from outside that it was contained: files unread and unchanged, processes bounded and
gone, the trainer's environment, sockets, network and process out of reach."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from hflow.engine.rollout.code_tool import SandboxSettings, run_python

REPO = Path(__file__).resolve().parents[3]
BWRAP = SandboxSettings("bwrap")

pytestmark = pytest.mark.usefixtures("bwrap")


def run(code: str, **limits) -> str:
    return run_python(textwrap.dedent(code), settings=BWRAP, **limits)


def attempts(paths: list[str], action: str) -> str:
    """A program that tries `action` (a lambda of a path) on each path and prints what happened."""
    return f"""
        for path in {paths!r}:
            try:
                result = ({action})(path)
                print("DONE", path, repr(result)[:80])
            except Exception as err:
                print("FAILED", path, type(err).__name__)
        """


def test_files_outside_the_sandbox_cannot_be_read(tmp_path):
    secret = f"secret-{uuid.uuid4()}"
    home_key = tmp_path / "home" / "user" / ".ssh" / "id_rsa"
    run_file = tmp_path / "runs" / "grpo-20261125" / "recipe.yaml"
    for path in (home_key, run_file):
        path.parent.mkdir(parents=True)
        path.write_text(secret)
    paths = ["/etc/shadow", "/etc/passwd", str(home_key), str(run_file), str(REPO / "pyproject.toml"),
             str(Path(sysconfig.get_paths()["purelib"]) / "torch" / "__init__.py"), os.path.expanduser("~/.bashrc")]
    out = run(attempts(paths, "lambda p: open(p).read()"))
    assert secret not in out
    assert out.count("FAILED") == len(paths) and "DONE" not in out, out
    listed = run(attempts(["/", "/etc", "/tmp"], "lambda p: sorted(__import__('os').listdir(p))"))
    assert "DONE / " in listed and "'home'" not in listed and "'root'" not in listed and "'work'" not in listed, listed
    assert "DONE /etc ['ld.so.cache']" in listed and "DONE /tmp ['main.py']" in listed, listed
    imports = run("import importlib\nfor name in ('torch', 'hflow', 'numpy'):\n"
                  "    try:\n        importlib.import_module(name); print('IMPORTED', name)\n"
                  "    except ImportError:\n        print('no', name)")
    assert "IMPORTED" not in imports and imports.count("no ") == 3, imports


def test_writes_outside_the_cwd_fail_and_leave_the_target_unchanged(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def reward(prompts, responses): return [0.0] * len(responses)\n")
    before = reward.read_bytes()
    paths = [str(reward), str(tmp_path / "new.txt"), "/usr/lib/x", "/x", "/dev/x", "/etc/x", "/proc/sys/kernel/x"]
    out = run(textwrap.dedent(attempts(paths, "lambda p: open(p, 'a').write('hacked')")) +
              "import os; open('/tmp/mine.txt', 'w').write('ok'); print('CWD', os.getcwd(), open('mine.txt').read())")
    assert out.count("FAILED") == len(paths) and "DONE" not in out, out
    assert "CWD /tmp ok" in out
    assert reward.read_bytes() == before and not (tmp_path / "new.txt").exists()
    # the interpreter's own library is read-only too
    stdlib = run("import os; open(os.__file__, 'a').write('# hacked')")
    assert "Read-only file system" in stdlib or "PermissionError" in stdlib, stdlib


def test_processes_are_counted_and_bounded():
    out = run("""
        import os, time
        children = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
            except OSError as err:
                print("fork refused:", err.strerror)
                break
        print("children", children)
        """, processes=16)
    assert "fork refused: Resource temporarily unavailable" in out, out
    children = int(out.split("children")[1].split()[0])
    assert 0 < children < 16  # the sandbox's init and the program itself count too
    spawned = run("import subprocess; print(subprocess.run(['/bin/true']).returncode)")
    assert spawned.strip() == "0"  # subprocesses run, inside the same limits


@pytest.mark.slow
def test_a_fork_bomb_ends_with_an_error():
    out = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """, processes=8, cpu_s=1, timeout_s=30)
    assert out == "error: killed: CPU time limit of 1 s (all its processes together)", out


def test_memory_over_the_limit_across_children_is_killed():
    # four children of 100 MB each: every one under the 256 MB limit, together over it
    out = run("""
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                block = b"x" * (100 << 20)
                time.sleep(60)
        time.sleep(60)
        """, memory_mb=256, timeout_s=30)
    assert out == "error: killed: memory limit of 256 MB (all its processes together)", out
    alone = run("block = b'x' * (512 << 20)", memory_mb=256)
    assert "MemoryError" in alone, alone


def _host_processes_with(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and token.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            pass
    return found


def test_a_setsid_child_is_gone_when_the_call_returns():
    token = f"hflow-daemon-{uuid.uuid4()}"
    out = run(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # a daemon: a new session, reparented away from the program
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{token}"])
            os._exit(0)
        for _ in range(500):  # wait until it runs under its own name, then return at once
            if any(b"{token}" in open(f"/proc/{{p}}/cmdline", "rb").read() for p in os.listdir("/proc") if p.isdigit()):
                print("daemon started")
                break
            time.sleep(0.01)
        """)
    assert out.strip() == "daemon started", out
    assert _host_processes_with(token) == []


@pytest.mark.slow
def test_cpu_burned_through_a_fork_chain_is_killed_at_the_limit():
    # each link burns 0.3 s of CPU, forks the next and exits: no process comes near RLIMIT_CPU
    out = run("""
        import os, time
        if os.fork() == 0:
            while True:
                start = time.process_time()
                while time.process_time() - start < 0.3:
                    pass
                if os.fork():
                    os._exit(0)
        time.sleep(60)
        """, cpu_s=1, timeout_s=30)
    assert out == "error: killed: CPU time limit of 1 s (all its processes together)", out


def test_unix_sockets_outside_are_unreachable(tmp_path):
    path = tmp_path / "raylet.sock"
    abstract = f"\0hflow-test-{uuid.uuid4()}"
    servers = []
    for address in (str(path), abstract):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen()
        server.setblocking(False)
        servers.append(server)
    try:
        out = run("import socket\n" + textwrap.dedent(attempts(
            [str(path), abstract], "lambda p: socket.socket(socket.AF_UNIX).connect(p)")))
        assert out.count("FAILED") == 2 and "DONE" not in out, out
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody connected
    finally:
        for server in servers:
            server.close()


def test_the_trainers_environment_is_unreadable(monkeypatch):
    secret = f"wandb-{uuid.uuid4()}"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    out = run(f"""
        import os
        print(sorted(os.environ))
        for pid in [os.getppid(), {os.getpid()}, {os.getppid()}] + [p for p in os.listdir("/proc") if p.isdigit()]:
            for what in ("environ", "cmdline"):
                try:
                    print(pid, what, open(f"/proc/{{pid}}/{{what}}", "rb").read())
                except OSError as err:
                    print(pid, what, type(err).__name__)
        """)
    assert secret not in out and "WANDB" not in out
    assert set(eval(out.splitlines()[0])) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "LC_CTYPE"}, out


def test_the_trainer_cannot_be_signalled():
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a trainer process
    try:
        out = run(f"""
            import os
            for pid in (os.getppid(), {stand_in.pid}, {os.getpid()}, -1, 1):
                try:
                    os.kill(pid, 9)
                    print("sent", pid)
                except OSError as err:
                    print("refused", pid, type(err).__name__)
            print("still here")
            """)
        assert "still here" in out, out
        assert stand_in.poll() is None  # alive, as is this test's process
        os.kill(os.getpid(), 0)
    finally:
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait()


def test_there_is_no_network():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        out = run(f"""
            import socket
            print([name for _, name in socket.if_nameindex()])
            for host in ("127.0.0.1", "10.0.0.1", "pypi.org"):
                try:
                    socket.create_connection((host, {port}), timeout=2)
                    print("CONNECTED", host)
                except OSError as err:
                    print("no", host, type(err).__name__)
            """)
        assert out.splitlines()[0] == "['lo']" and "CONNECTED" not in out and out.count("no ") == 3, out
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_each_call_starts_from_an_empty_tmp_of_bounded_size():
    assert run("open('/tmp/note', 'w').write('first call')") == ""
    assert run("import os; print(sorted(os.listdir('.')))").strip() == "['main.py']"
    out = run("open('big', 'wb').write(b'x' * (32 << 20))", disk_mb=16)
    assert "No space left on device" in out, out


def test_concurrent_calls_are_apart():
    results = {}

    def call(i):
        results[i] = run(f"import os, time; open('mine', 'w').write('{i}'); time.sleep(0.3); "
                         "print(open('mine').read(), len([p for p in os.listdir('/proc') if p.isdigit()]))")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i} 2\n" for i in range(4)}  # its own file; its init and itself only
