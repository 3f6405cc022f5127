"""Mirror a run's events to Weights & Biases, when the recipe asks for it.

The trainer already writes every step to ``events.jsonl`` (DESIGN.md, "Runs");
``WandbLogger.log`` takes that same dict, so wandb shows exactly the keys the
monitor does. wandb is optional at run time: when it is disabled, or not
importable, the logger is a no-op (one warning line in the latter case), and
a wandb failure never stops training — a lost chart is cheaper than a lost run.

wandb writes under ``<run_dir>/wandb``. The run's wandb id is kept in
``<run_dir>/wandb/hflow-run-id`` so a resumed hflow run continues the same
wandb run instead of starting a new one.

The API key is never read into a variable that is printed or logged: we only
check whether one is configured, and recipe keys that look like credentials
are dropped from the wandb config.
"""

from __future__ import annotations

import logging
import netrc
import os
import uuid
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

log = logging.getLogger(__name__)

MODES = ("online", "offline", "disabled")
SECRET_WORDS = ("token", "key", "secret", "password")
ID_FILE = "hflow-run-id"


def scrub_secrets(obj: Any) -> Any:
    """A copy of ``obj`` without dict keys that contain token, key, secret or password.

    Applied to the recipe before it becomes the wandb config, which is uploaded
    and shown to everyone with access to the project.
    """
    if isinstance(obj, Mapping):
        return {
            k: scrub_secrets(v)
            for k, v in obj.items()
            if not any(word in str(k).lower() for word in SECRET_WORDS)
        }
    if isinstance(obj, (list, tuple)):
        return [scrub_secrets(v) for v in obj]
    return obj


def api_key_configured() -> bool:
    """Whether wandb would find an API key: ``WANDB_API_KEY`` or a netrc entry for the wandb host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str | None) -> str:
    """The recipe's mode; if unset, ``WANDB_MODE`` when set, else online with an API key, offline without."""
    if mode is None:
        env = os.environ.get("WANDB_MODE")
        if env in MODES:
            return env
        return "online" if api_key_configured() else "offline"
    if mode not in MODES:
        raise ValueError(f"logging.wandb.mode: {mode!r} is not one of {', '.join(MODES)} (or null for automatic)")
    return mode


class WandbLogger:
    """Logs events.jsonl objects to wandb; a no-op when disabled or unavailable.

    ``cfg`` is the recipe's ``logging.wandb`` section as a plain dict:
    ``{"enabled", "project", "entity", "name", "mode"}`` (missing keys: defaults).
    ``recipe`` is the resolved recipe, sent as the wandb config minus secrets.
    """

    def __init__(self, cfg: Mapping[str, Any] | None, run_dir: str | os.PathLike, recipe: Mapping[str, Any] | None = None):
        cfg = dict(cfg or {})
        self.run_dir = Path(run_dir)
        self.run = None
        self._wandb = None
        self._last_step: int | None = None
        self.mode = resolve_mode(cfg.get("mode")) if cfg.get("enabled") else "disabled"
        if self.mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            log.warning("wandb logging is enabled in the recipe but wandb is not installed; continuing without it (pip install wandb)")
            self.mode = "disabled"
            return
        self._wandb = wandb
        self._start(cfg, recipe)

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def _start(self, cfg: dict, recipe: Mapping[str, Any] | None) -> None:
        wandb_dir = self.run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        id_file = wandb_dir / ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        try:
            self.run = self._wandb.init(
                project=cfg.get("project") or "hflow",
                entity=cfg.get("entity"),
                name=cfg.get("name") or self.run_dir.name,
                mode=self.mode,
                dir=str(self.run_dir),  # wandb adds the "wandb/" folder itself
                id=run_id,
                resume="allow",
                config=scrub_secrets(dict(recipe or {})),
                # train.log already has the console; stats threads would compete with training for CPU.
                settings=self._wandb.Settings(console="off", x_disable_stats=True, silent=True),
            )
        except Exception as e:  # wandb raises many types (network, auth, usage); none should stop training
            log.warning("wandb.init failed (%s: %s); continuing without wandb", type(e).__name__, e)
            self.run, self.mode = None, "disabled"
            return
        id_file.write_text(run_id + "\n")

    def log(self, event: Mapping[str, Any]) -> None:
        """Log every key of one events.jsonl object except ``step`` and ``time``, at ``step``.

        Steps at or before the last logged one are skipped: after a resume the
        trainer may replay steps wandb already has, and wandb rejects them.
        """
        if self.run is None:
            return
        step = int(event["step"])
        if self._last_step is not None and step <= self._last_step:
            return
        data = {k: v for k, v in event.items() if k not in ("step", "time")}
        try:
            self.run.log(data, step=step)
        except Exception as e:
            log.warning("wandb.log failed at step %d (%s: %s); stopping wandb logging", step, type(e).__name__, e)
            self.run, self.mode = None, "disabled"
            return
        self._last_step = step

    def finish(self, status: str) -> None:
        """Close the wandb run; ``status`` (finished/failed) goes to its summary and exit code."""
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.summary["hflow/status"] = status
            run.finish(exit_code=0 if status == "finished" else 1)
        except Exception as e:
            log.warning("wandb finish failed (%s: %s)", type(e).__name__, e)
