"""Model-written code sent to a sandbox server over HTTP, for clusters: the code runs on machines
set apart for it, not on the training nodes. The API is SandboxFusion's (bytedance/SandboxFusion,
the server verl's code-RL recipes call):

    POST {url}/run_code  {"code": ..., "language": "python", "run_timeout": 10, "compile_timeout": 10,
                          "memory_limit_MB": 1024, "stdin": ""}
    ->  {"status": "Success" | "Failed" | "SandboxError", "message": ...,
         "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "return_code": 0,
                        "stdout": ..., "stderr": ..., "execution_time": ...}, "compile_result": ...}

Each request waits at most the run's timeout plus `REQUEST_SLACK_S`. A request that fails in
transport (refused, reset, timed out) or is answered 429 or 5xx is sent again, at most `retries`
more times, after 0.5, 1, 2, ... s. When every try failed, or the server answers another HTTP error
(a wrong URL path: 404), `SandboxUnavailable` stops the run with one line: the model's code
cannot be run, and error observations in its place would be trained on. An answer whose status is
`SandboxError` is about that program (the server could not run it): it becomes the model's
observation, not retried. The server's own isolation is what contains the code: hflow sends it
the code and nothing else.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from hflow.engine.rollout.sandbox import Limits, Outcome, SandboxUnavailable
from hflow.errors import MachineError

REQUEST_SLACK_S = 10.0  # over the run's timeout: the server's queue and start-up
RETRY_STATUSES = {429, 500, 502, 503, 504}
BACKOFF_S = 0.5  # before the first retry; doubled each time, at most MAX_BACKOFF_S
MAX_BACKOFF_S = 8.0


class ServerUnavailable(SandboxUnavailable, MachineError):
    """The sandbox server could not be reached or refused every try: exit code 1, one line."""


def run_remote(code: str, limits: Limits, url: str, retries: int = 3,
               request_timeout_s: float | None = None) -> Outcome:
    """Run `code` on the SandboxFusion server at `url` (its base, or its /run_code endpoint)."""
    endpoint = url.rstrip("/") if url.rstrip("/").endswith("/run_code") else url.rstrip("/") + "/run_code"
    body = json.dumps({"code": code, "language": "python", "run_timeout": limits.timeout_s,
                       "compile_timeout": limits.timeout_s, "memory_limit_MB": limits.memory_mb,
                       "stdin": ""}).encode()
    timeout = request_timeout_s if request_timeout_s is not None else limits.timeout_s + REQUEST_SLACK_S
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S))
        request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code} {err.reason}"
            if err.code in RETRY_STATUSES:
                continue
            raise ServerUnavailable(f"sandbox server {endpoint}: {last}; check the URL (a SandboxFusion "
                                    "server answers POST /run_code)") from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as err:
            last = str(getattr(err, "reason", err)) or type(err).__name__
            continue
        except ValueError:
            raise ServerUnavailable(f"sandbox server {endpoint}: the answer is not JSON; is it a SandboxFusion "
                                    "server?") from None
        return _outcome(answer, limits)
    raise ServerUnavailable(f"sandbox server {endpoint}: no answer after {retries + 1} tries (last: {last}); "
                            "start the server or fix the URL")


def _outcome(answer: dict, limits: Limits) -> Outcome:
    """SandboxFusion's answer as an Outcome: stdout then stderr (of compiling, then running)."""
    if not isinstance(answer, dict):
        answer = {}
    run = answer.get("run_result") or {}
    compiled = answer.get("compile_result") or {}
    text = "".join(str(part.get(key) or "") for part in (compiled, run) for key in ("stdout", "stderr"))
    output = text.encode()[:limits.output_bytes]
    if answer.get("status") == "SandboxError":
        message = (str(answer.get("message") or "").strip().splitlines() or ["no message"])[0]
        return Outcome(output, f"error: the sandbox server could not run the code ({message})")
    if run.get("status") == "TimeLimitExceeded":
        return Outcome(output, f"error: timed out after {limits.timeout_s:g} s (wall clock)")
    code = run.get("return_code")
    if run.get("status") == "Error" or (code is None and answer.get("status") != "Success"):
        return Outcome(output, "error: the program could not be run")
    return Outcome(output, "" if not code else f"exit code {code}")
