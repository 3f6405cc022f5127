"""Environments that run model-written code, for the sandbox checks (importable as `code_envs`:
tests/ is on the path in-process, and on PYTHONPATH for the CLI tests that use them)."""

from hflow.engine.rollout.code_tool import python_tool
from hflow.engine.rollout.tools import ToolEnv


class PythonEnv(ToolEnv):
    """The model may run Python; its answer scores 1 when it holds the row's answer."""

    tools = [python_tool]

    def reset(self, row):
        self.answer = str(row["answer"])
        return None

    def score(self, answer):
        return float(self.answer in answer)
