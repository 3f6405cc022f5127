"""hflow: RL training of language models after HybridFlow (Sheng et al., EuroSys 2025).

From Python: `hflow.train(recipe, ...)`, `hflow.evaluate(recipe, checkpoint)`, `hflow.Run`
(`trainer/api/`); they load torch only when called, so `import hflow` stays light."""

__version__ = "0.1.0"
__all__ = ["Run", "evaluate", "train"]


def __getattr__(name: str):
    if name in ("train", "evaluate"):
        from hflow.trainer.api import train as api

        return getattr(api, name)
    if name == "Run":
        from hflow.trainer.api.run import Run

        return Run
    raise AttributeError(f"module 'hflow' has no attribute {name!r}")
