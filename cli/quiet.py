"""Keep library chatter (progress bars, advice) off the console of a command."""

from __future__ import annotations

import os
import sys
import warnings


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # e.g. transformers' GGUF dequantization bar; read at tqdm's import
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # Read by transformers when it loads (its progress bars follow HF_HUB_DISABLE_PROGRESS_BARS):
    # transformers takes 1.6 s to import, which a command that stops at a mistake never needs.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:  # already loaded (a caller's own import): tell it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
