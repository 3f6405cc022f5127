"""The recipe's `tools` section: where the code that `rollout.env`'s tools run for the model
executes (`engine/rollout/code_tool.py`; docs/security.md). `recipe.py` puts it in the `Recipe`
and checks that `sandbox` and `sandbox_url` agree."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from hflow.trainer.config.sections import Section


class ToolsConfig(Section):
    sandbox: Literal["bwrap", "http", "none"] = Field(
        "bwrap",
        description="Where model-written code runs (a `rollout.env` with a code tool such as `python_tool`). "
        "`bwrap`: a bubblewrap sandbox on this machine, made per call: its own read-only view of /usr and the "
        "Python stdlib and a fresh /tmp, no network, its own PID and user namespaces, CPU, memory and process "
        "limits over all its processes, nothing left running when the call returns; checked at start-up "
        "(install the `bubblewrap` package). `http`: a SandboxFusion server at `tools.sandbox_url`, for "
        "clusters. `none`: a plain subprocess that runs as you and can read and write your files; logged as "
        "a warning, for a machine that is itself a throw-away sandbox.",
    )
    sandbox_url: Optional[str] = Field(
        None,
        description="tools.sandbox http: the SandboxFusion server's base URL (its POST /run_code runs the code), "
        "e.g. http://sandbox:8080. Failed requests are retried at most 3 times; then the run stops.",
    )
