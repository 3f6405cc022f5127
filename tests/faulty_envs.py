"""Environments with a bug, for the fault tests (importable as `faulty_envs`: tests/ is put on
PYTHONPATH by the tests that use them)."""


class StepRaises:
    def reset(self, row):
        return None  # the row's own prompt

    def step(self, assistant_text):
        raise RuntimeError("the environment broke")
