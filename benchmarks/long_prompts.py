"""Write a JSONL data set of long `digits` prompts, for measuring prompt sharing in training.

    python benchmarks/long_prompts.py OUT.jsonl [--rows 256] [--words 40]

Each prompt is `--words` random words (seeded) followed by " digits: " (about 250 characters,
one token each with the tiny tokenizer); the built-in synthetic reward scores it as the
`digits` task.
"""

from __future__ import annotations

import argparse
import json
import random

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--words", type=int, default=40)
    args = parser.parse_args()
    rng = random.Random(0)
    with open(args.out, "w") as f:
        for _ in range(args.rows):
            prompt = " ".join(rng.choice(WORDS) for _ in range(args.words)) + " digits: "
            f.write(json.dumps({"prompt": prompt, "task": "digits", "answer": ""}) + "\n")


if __name__ == "__main__":
    main()
