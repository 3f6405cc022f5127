"""hflow: RL training of language models after HybridFlow (Sheng et al., EuroSys 2025).

From Python: `hflow.train(recipe, ...)`, `hflow.evaluate(recipe, checkpoint)`, `hflow.compare(recipe,
a, b)`, `hflow.Run`
(`trainer/api/`); they load torch only when called, so `import hflow` stays light."""

__version__ = "0.1.0"
__all__ = ["Run", "compare", "evaluate", "train"]


def __getattr__(name: str):
    if name == "train":
        from hflow.trainer.api.train import train

        return train
    if name in ("evaluate", "compare"):
        from hflow.trainer.api import evaluation

        return getattr(evaluation, name)
    if name == "Run":
        from hflow.trainer.api.run import Run

        return Run
    raise AttributeError(f"module 'hflow' has no attribute {name!r}")
