"""One decoding step of the lean `hf` path (`engine/rollout/fast_decode.py`) in two versions, in one
process, rounds alternating (the machine's drift falls on both alike): the code at a commit against
the working tree's (`--before`), or two of the working tree's layouts (`--layouts`).

    python benchmarks/decode_step_ab.py --before HEAD~1 --model /tmp/m/small --rows 64 --rounds 12
    python benchmarks/decode_step_ab.py --layouts columns,rows --model M --device cuda --dtype bfloat16

Both decoders start from the same prefill (`--rows` / `--repeat` prompts of `--prompt` random
tokens, each sampled `--repeat` times) and are fed the same tokens for `--steps` steps; milliseconds
per step, sorted, and the largest difference between the two's last logits. The models are hflow's
(its linear layers routed as `hflow train` routes them). A commit whose decoder takes no `repeat`
gets the prefill repeated to every row. A layout is `fast_decode.step_layout`'s: "rows" (a GPU's),
"packed" (oneDNN's on a CPU) or "columns" (a CPU's BLAS; on a GPU it runs as a CPU would run it).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "engine/rollout/fast_decode.py"


def module_at(revision: str | None, name: str):
    """`fast_decode` as it is at `revision` (None: the working tree), imported under `name`."""
    path = ROOT / SOURCE
    if revision is not None:
        text = subprocess.run(["git", "show", f"{revision}:{SOURCE}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        path = Path(tempfile.mkdtemp()) / "fast_decode.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def versions(a: argparse.Namespace) -> dict:
    """name -> a function making that version's decoder from (model, cache, mask, steps, repeat)."""
    if a.before:
        made = {"before": module_at(a.before, "fast_decode_before"), "after": module_at(None, "fast_decode_after")}
        return {name: module.FastDecoder for name, module in made.items()}
    from hflow.engine.rollout import fast_decode

    def in_layout(layout: str):
        def make(*args, **kwargs):
            chosen = fast_decode.step_layout
            fast_decode.step_layout = lambda weight: layout
            try:
                return fast_decode.FastDecoder(*args, **kwargs)
            finally:
                fast_decode.step_layout = chosen
        return make
    return {layout: in_layout(layout) for layout in a.layouts.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--before", help="a git revision")
    which.add_argument("--layouts", help="two layouts of the working tree, e.g. columns,rows")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="samples per prompt")
    parser.add_argument("--steps", type=int, default=56)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM

    from hflow.engine.kernels import product_route
    from hflow.engine.padding import positions

    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(device).eval()
    product_route.route_linears(model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (a.rows // a.repeat, a.prompt), generator=g).to(device)
    mask = torch.ones_like(ids)

    def decoder(make):
        """A fresh prefill, and a decoder made by `make` on it."""
        with torch.no_grad():
            cache = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True).past_key_values
        if "repeat" in inspect.signature(make).parameters or a.layouts:
            return make(model, cache, mask, a.steps, repeat=a.repeat)
        cache.batch_repeat_interleave(a.repeat)
        return make(model, cache, mask.repeat_interleave(a.repeat, 0), a.steps)

    tokens = torch.randint(3, vocab, (a.steps, a.rows), generator=g).to(device)
    made = versions(a)
    times, last = {k: [] for k in made}, {}
    for r in range(a.rounds):
        for name in (list(made) if r % 2 == 0 else list(made)[::-1]):
            decode = decoder(made[name])
            sync()
            start = time.perf_counter()
            for step in tokens:
                last[name] = decode.step(step)
            sync()
            times[name].append((time.perf_counter() - start) * 1e3 / a.steps)
    print(f"{a.model} ({a.dtype}, {a.device}): {a.rows} rows ({a.repeat} per prompt), {a.steps} steps after "
          f"{a.prompt} prompt tokens, {a.rounds} rounds")
    for name, ms in times.items():
        print(f"{name:7s} ms/step median {statistics.median(ms):.3f}  all {', '.join(f'{t:.2f}' for t in sorted(ms))}")
    first, second = list(made)
    print(f"largest difference of the last logits: {float((last[first] - last[second]).abs().max()):.2e}")


if __name__ == "__main__":
    main()
