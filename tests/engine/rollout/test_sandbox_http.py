"""The http sandbox against a fake SandboxFusion server on 127.0.0.1: what is sent, how each
answer reads to the model, and retries that are bounded, ending the run in one line when the
server cannot be reached."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hflow.engine.rollout import code_tool, sandbox_http
from hflow.engine.rollout.code_tool import SandboxSettings, python_tool, run_python
from hflow.engine.rollout.sandbox import Limits
from hflow.engine.rollout.sandbox_http import ServerUnavailable, run_remote
from hflow.engine.rollout.tools import ToolCall, ToolRunner
from hflow.errors import MachineError


def finished(stdout="", stderr="", return_code=0, status="Finished"):
    overall = "Success" if status == "Finished" and return_code == 0 else "Failed"
    return 200, {"status": overall, "message": "", "compile_result": None, "files": {},
                 "run_result": {"status": status, "execution_time": 0.01, "return_code": return_code,
                                "stdout": stdout, "stderr": stderr}}


class FakeSandboxFusion:
    """Answers POST /run_code with the scripted (HTTP status, JSON body) pairs in turn, the last
    one from then on; ("sleep", s) waits s seconds first. Keeps what it was sent."""

    def __init__(self, *answers):
        self.answers, self.requests = list(answers), []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                fake.requests.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                answer = fake.answers.pop(0) if len(fake.answers) > 1 else fake.answers[0]
                if answer[0] == "sleep":
                    time.sleep(answer[1])
                    answer = finished("late\n")
                status, body = answer
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server_factory(monkeypatch):
    monkeypatch.setattr(sandbox_http, "BACKOFF_S", 0.01)
    made = []

    def make(*answers):
        made.append(FakeSandboxFusion(*answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_the_code_and_its_limits_are_sent_and_the_output_comes_back(server_factory):
    server = server_factory(finished("42\n"))
    assert run_python("print(6 * 7)", settings=SandboxSettings("http", server.url)) == "42\n"
    assert run_python("print(6 * 7)", timeout_s=3, memory_mb=256,
                      settings=SandboxSettings("http", server.url + "/run_code/")) == "42\n"
    (path, first), (path2, second) = server.requests
    assert path == path2 == "/run_code"
    assert first["code"] == "print(6 * 7)" and first["language"] == "python"
    assert (first["run_timeout"], first["memory_limit_MB"]) == (10, 1024)
    assert (second["run_timeout"], second["memory_limit_MB"]) == (3, 256)


@pytest.mark.parametrize("answer, expected", [
    (finished("partial\n", "Traceback ...\nValueError: no\n", 1),
     "partial\nTraceback ...\nValueError: no\n\nexit code 1"),
    (finished("tick\n", status="TimeLimitExceeded", return_code=None),
     "tick\n\nerror: timed out after 10 s (wall clock)"),
    ((200, {"status": "SandboxError", "message": "runner crashed\nmore", "run_result": None}),
     "error: the sandbox server could not run the code (runner crashed)"),
])
def test_each_answer_reads_as_the_bwrap_sandbox_would(server_factory, answer, expected):
    server = server_factory(answer)
    assert run_python("x", settings=SandboxSettings("http", server.url)) == expected
    assert len(server.requests) == 1  # an answer about the program is not retried


def test_a_busy_server_is_tried_again(server_factory):
    server = server_factory((503, None), (504, None), finished("ok\n"))
    assert run_python("print('ok')", settings=SandboxSettings("http", server.url)) == "ok\n"
    assert len(server.requests) == 3


def test_retries_are_bounded_and_end_the_run_in_one_line(server_factory):
    server = server_factory((502, None))
    with pytest.raises(ServerUnavailable) as err:
        run_python("print(1)", settings=SandboxSettings("http", server.url))
    line = str(err.value)
    assert len(server.requests) == 4  # the first try and 3 retries
    assert line.startswith(f"tools.sandbox_url '{server.url}': sandbox server {server.url}/run_code: no answer "
                           "after 4 tries (last: HTTP 502") and "\n" not in line, line
    assert isinstance(err.value, MachineError) and err.value.exit_code == 1


def test_a_slow_server_times_out_each_try(server_factory):
    server = server_factory(("sleep", 2.0))
    with pytest.raises(ServerUnavailable, match="no answer after 2 tries .last: timed out"):
        run_remote("print(1)", Limits(), server.url, retries=1, request_timeout_s=0.3)
    assert len(server.requests) == 2


def test_a_wrong_path_is_not_retried(server_factory):
    server = server_factory((404, None))
    with pytest.raises(ServerUnavailable, match="HTTP 404 Not Found; check the URL"):
        run_python("print(1)", settings=SandboxSettings("http", server.url + "/v2"))
    assert [path for path, _ in server.requests] == ["/v2/run_code"]


def test_no_server_stops_the_tool_environment(monkeypatch):
    monkeypatch.setattr(sandbox_http, "BACKOFF_S", 0.01)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    code_tool.configure(SandboxSettings("http", f"http://127.0.0.1:{port}"))
    try:
        runner = ToolRunner([python_tool], timeout_s=60)
        with pytest.raises(ServerUnavailable, match="no answer after 4 tries .last: .*refused"):
            runner.call(ToolCall("python_tool", {"code": "print(1)"}))
    finally:
        code_tool.configure(SandboxSettings())
