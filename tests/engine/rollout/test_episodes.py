"""Multi-turn episodes: the tokens trained on are exactly the sampled ones, the environment's tokens
sit between them with loss mask 0, and the chat template's delta rebuilds the conversation."""

import asyncio
import threading

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import build_tiny_tokenizer, load_causal_lm, load_tokenizer
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.rollout.environment import EpisodeLimits
from hflow.engine.rollout.episodes import EpisodeRunner
from hflow.engine.rollout.generation import HFGenerator, SamplingParams
from hflow.engine.training.logprobs import response_log_probs
from hflow.errors import UserError

# A ChatML (Qwen-style) template, with a tools block, on the tiny tokenizer plus its two markers.
CHATML = (
    "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_SPECS = [{"type": "function", "function": {"name": "add", "description": "", "parameters": {}}}]


def chatml_tokenizer():
    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


class ThreeTurnEnv:
    """Answers twice with a tool message, then ends; reward t + 1 on turn t."""

    tool_specs = TOOL_SPECS

    def reset(self, row):
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turn += 1
        return [{"role": "tool", "content": f"result {self.turn}"}], float(self.turn), self.turn == 3


class ScriptedGenerator:
    """Stands in for the hf engine: 'samples' scripted turns and records the contexts it was given."""

    def __init__(self, tok):
        self.tok, self.pad, self.contexts, self.calls = tok, tok.pad_token_id, [], 0

    def turn_ids(self, episode: int, turn: int) -> list[int]:
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        return self.tok(f"a{episode}t{turn}", add_special_tokens=False)["input_ids"] + [end]

    def generate(self, prompts, n, params, rng=None):
        assert n == 1
        self.contexts.append([list(p) for p in prompts])
        turns = [self.turn_ids(row, self.calls) for row in range(len(prompts))]
        self.calls += 1
        lengths = torch.tensor([len(t) for t in turns])
        tokens = torch.tensor(turns)
        logps = -0.1 * torch.arange(1, tokens.shape[1] + 1, dtype=torch.float).expand_as(tokens)
        return assemble_rollout(prompts, tokens, lengths, self.pad, rollout_log_probs=logps,
                                rollout_entropy=torch.ones_like(logps))


def test_three_turns_train_exactly_the_sampled_tokens_with_the_template_delta_between():
    tok = chatml_tokenizer()
    gen = ScriptedGenerator(tok)
    runner = EpisodeRunner(gen, tok, ThreeTurnEnv, "tests:ThreeTurnEnv", EpisodeLimits(4, 200, 60.0, 0.5))
    rows = [{"prompt": "hi"}, {"prompt": "yo"}]
    out = runner.run(rows, [[1], [1]], 1, SamplingParams(max_new_tokens=50), None)
    for row, episode in enumerate(out[col.EPISODE]):
        real = out[col.ATTENTION_MASK][row, -out[col.RESPONSES].shape[1]:].bool()
        response = out[col.RESPONSES][row][real].tolist()
        trained = out[col.RESPONSE_MASK][row][real].bool()
        sampled = [gen.turn_ids(row, t) for t in range(3)]
        # Trained tokens: the three sampled turns, token for token, with their sampler log-probs.
        assert [t for t, m in zip(response, trained) if m] == sum(sampled, [])
        logps = out[col.ROLLOUT_LOG_PROBS][row][real]
        assert logps[trained].tolist() == pytest.approx(sum([[-0.1 * (i + 1) for i in range(len(s))]
                                                             for s in sampled], []))
        assert (logps[~trained] == 0).all() and int((~trained).sum()) > 0
        # Each turn was sampled after the prompt and every token before it, never re-tokenized.
        prompt = tok(tok.apply_chat_template([{"role": "user", "content": rows[row]["prompt"]}], tools=TOOL_SPECS,
                                             add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
        starts = [i for i in range(len(response)) if trained[i] and (i == 0 or not trained[i - 1])]
        assert len(starts) == 3
        for turn, start in enumerate(starts):
            assert gen.contexts[turn][row] == prompt + response[:start]
        # The environment's tokens are exactly the template's rendering of the whole conversation.
        conversation = [{"role": "user", "content": rows[row]["prompt"]}]
        for turn in range(3):
            conversation.append({"role": "assistant", "content": f"a{row}t{turn}"})
            if turn < 2:
                conversation.append({"role": "tool", "content": f"result {turn + 1}"})
        rendered = tok.apply_chat_template(conversation, tools=TOOL_SPECS, tokenize=False)
        assert tok.decode(prompt + response) + "\n" == rendered
        assert episode["ended"] == "done" and len(episode["turns"]) == 3
        assert episode["return"] == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)  # discounted by 0.5 per turn


def test_limits_end_episodes_on_turns_and_tokens():
    tok = chatml_tokenizer()
    out = EpisodeRunner(ScriptedGenerator(tok), tok, ThreeTurnEnv, "x:E", EpisodeLimits(2, 200, 60.0)).run(
        [{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=50), None)
    (episode,) = out[col.EPISODE]
    assert episode["ended"] == "max_turns" and episode["return"] == 1 + 2
    last = out[col.RESPONSES][0][out[col.ATTENTION_MASK][0, -out[col.RESPONSES].shape[1]:].bool()][-1]
    assert last == tok.convert_tokens_to_ids("<|im_end|>")  # no observation after the last turn
    out = EpisodeRunner(ScriptedGenerator(tok), tok, ThreeTurnEnv, "x:E", EpisodeLimits(4, 20, 60.0)).run(
        [{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=50), None)
    assert out[col.EPISODE][0]["ended"] == "max_tokens"
    assert int(out[col.ATTENTION_MASK][0, -out[col.RESPONSES].shape[1]:].sum()) <= 20


def test_a_turn_that_fills_its_room_without_ending_is_marked_cut():
    tok = chatml_tokenizer()
    gen = ScriptedGenerator(tok)
    gen.eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    whole = len(gen.turn_ids(0, 0))  # "a0t0" and <|im_end|>
    for room, cut in ((whole, False), (whole - 1, True)):  # room for the end token, or not
        out = EpisodeRunner(gen, tok, ThreeTurnEnv, "x:E", EpisodeLimits(1, 200, 60.0, max_turn_tokens=room)).run(
            [{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=50), None)
        gen.calls = 0
        assert [t["cut"] for t in out[col.EPISODE][0]["turns"]] == [cut], room


class BrokenEnv(ThreeTurnEnv):
    def step(self, text):
        raise KeyError("oops")


def test_an_environment_that_raises_is_a_user_error_naming_the_key():
    tok = chatml_tokenizer()
    runner = EpisodeRunner(ScriptedGenerator(tok), tok, BrokenEnv, "mod:BrokenEnv", EpisodeLimits(3, 100, 60.0))
    with pytest.raises(UserError, match=r"rollout.env 'mod:BrokenEnv': step\(\) raised KeyError"):
        runner.run([{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=50), None)


def test_real_sampling_log_probs_match_the_trained_forward_over_three_turns(tiny_model):
    """The hf engine samples each turn; scoring the assembled episode as training does gives the
    sampler's log-probs at every trained token: the context of each was exactly what was sampled."""
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32).eval()
    gen = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 16)
    runner = EpisodeRunner(gen, tok, ThreeTurnEnv, "x:E", EpisodeLimits(3, 100, 60.0, 1.0, 6))
    out = runner.run([{"prompt": "ab"}, {"prompt": "c"}], [[1], [1]], 2, SamplingParams(max_new_tokens=6),
                     torch.Generator().manual_seed(0))
    episodes = out.pop(col.EPISODE)
    assert all(len(e["turns"]) == 3 for e in episodes)
    mask = out[col.RESPONSE_MASK].bool()
    real = out[col.ATTENTION_MASK][:, -mask.shape[1]:].bool()
    assert int((real & ~mask).sum()) > 0  # observation tokens: attended, not trained
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, Batch(out), 1.0)
    torch.testing.assert_close(log_probs[mask], out[col.ROLLOUT_LOG_PROBS][mask], atol=1e-4, rtol=1e-4)


def test_a_tokenizer_without_a_chat_template_is_a_user_error():
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(UserError, match="rollout.env needs a tokenizer with a chat template"):
        EpisodeRunner(ScriptedGenerator(tok), tok, ThreeTurnEnv, "x:E", EpisodeLimits(3, 100, 60.0)).run(
            [{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=5), None)


def test_a_template_that_rewrites_earlier_messages_is_a_user_error():
    tok = chatml_tokenizer()  # drops every message but the last two once there are more: no delta exists
    tok.chat_template = "{% for m in messages[-2:] %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(UserError, match="renders a conversation's earlier messages differently"):
        EpisodeRunner(ScriptedGenerator(tok), tok, ThreeTurnEnv, "x:E", EpisodeLimits(3, 100, 60.0)).run(
            [{"prompt": "hi"}], [[1]], 1, SamplingParams(max_new_tokens=5), None)


class SlowFirstStepEnv(ThreeTurnEnv):
    """ThreeTurnEnv whose step on the first turn of the row "slow" waits until `release` is set (at
    most 30 s), then sets `done`: the tests below show order by these events, not by clocks."""

    release = threading.Event()
    done = threading.Event()

    def reset(self, row):
        self.slow = row["prompt"] == "slow"
        return super().reset(row)

    def step(self, text):
        if self.slow and self.turn == 0:
            SlowFirstStepEnv.release.wait(30)
            SlowFirstStepEnv.done.set()
        return super().step(text)


@pytest.fixture
def slow_step():
    SlowFirstStepEnv.release.clear()
    SlowFirstStepEnv.done.clear()
    yield SlowFirstStepEnv
    SlowFirstStepEnv.release.set()  # a step still waiting ends now


class ReleasingGenerator(ScriptedGenerator):
    """ScriptedGenerator that notes, at each call, whether the slow step had ended, and releases it
    after its third call."""

    def generate(self, prompts, n, params, rng=None):
        self.slow_done = getattr(self, "slow_done", []) + [SlowFirstStepEnv.done.is_set()]
        out = super().generate(prompts, n, params, rng)
        if len(self.contexts) == 3:
            SlowFirstStepEnv.release.set()
        return out


def test_a_slow_step_holds_back_its_own_episode_not_the_batch(slow_step):
    tok = chatml_tokenizer()
    gen = ReleasingGenerator(tok)
    runner = EpisodeRunner(gen, tok, SlowFirstStepEnv, "x:E", EpisodeLimits(3, 200, 60.0))
    out = runner.run([{"prompt": "hi"}, {"prompt": "slow"}, {"prompt": "yo"}], [[1]] * 3, 1,
                     SamplingParams(max_new_tokens=50), None)
    # The two fast episodes' second and third turns were generated while the slow step still ran:
    # it ends only once they are (a runner waiting for every step first would wait out its 30 s).
    assert [len(c) for c in gen.contexts[:3]] == [3, 2, 2]
    assert gen.slow_done == [False, False, False, True, True]
    assert [len(c) for c in gen.contexts[3:]] == [1, 1]  # then the slow one's, alone
    assert [e["ended"] for e in out[col.EPISODE]] == ["done"] * 3
    assert all(len(e["turns"]) == 3 for e in out[col.EPISODE])
    slow = out[col.EPISODE][1]["turns"][0]
    assert slow["env_s"] > 0 and slow["observation"] == [{"role": "tool", "content": "result 1"}]


def test_a_step_that_never_returns_ends_its_episode_at_the_deadline(slow_step):
    tok = chatml_tokenizer()
    runner = EpisodeRunner(ScriptedGenerator(tok), tok, SlowFirstStepEnv, "x:E", EpisodeLimits(3, 200, 1.0))
    out = runner.run([{"prompt": "slow"}, {"prompt": "hi"}], [[1]] * 2, 1, SamplingParams(max_new_tokens=50), None)
    assert not SlowFirstStepEnv.done.is_set()  # the run ended while the step still waited
    hung, fast = out[col.EPISODE]
    assert hung["ended"] == "timeout" and len(hung["turns"]) == 1 and hung["return"] == 0.0
    assert fast["ended"] == "done" and len(fast["turns"]) == 3


LEFT_BEHIND = """
import sys
sys.path.insert(0, sys.argv[1])
from test_episodes import *
SlowFirstStepEnv.seconds = 600.0
tok = chatml_tokenizer()
out = EpisodeRunner(ScriptedGenerator(tok), tok, SlowFirstStepEnv, "x:E", EpisodeLimits(3, 200, 1.0)).run(
    [{"prompt": "slow"}], [[1]], 1, SamplingParams(max_new_tokens=50), None)
print(out["episode"][0]["ended"])
"""


def test_a_step_left_behind_does_not_keep_the_process_from_exiting():
    """The abandoned step's thread is a daemon: the run's process ends when its work does, not
    when a hung environment step would have returned (here: after 600 s)."""
    import subprocess
    import sys
    from pathlib import Path

    result = subprocess.run([sys.executable, "-c", LEFT_BEHIND, str(Path(__file__).parent)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["timeout"], result.stderr[-2000:]


class AsyncThreeTurnEnv(ThreeTurnEnv):
    async def reset(self, row):
        return ThreeTurnEnv.reset(self, row)

    async def step(self, text):
        await asyncio.sleep(0.01)
        return ThreeTurnEnv.step(self, text)


class ContextGenerator(ScriptedGenerator):
    """Its turn depends on the context only, not on which batch it was generated in."""

    def generate(self, prompts, n, params, rng=None):
        self.calls = 0
        out = super().generate(prompts, n, params, rng)
        turns = [self.turn_ids(len(p) % 7, len(p) % 5) for p in prompts]
        return assemble_rollout(prompts, torch.tensor(turns), torch.tensor([len(t) for t in turns]), self.pad,
                                rollout_log_probs=torch.zeros(len(turns), len(turns[0])),
                                rollout_entropy=out[col.ROLLOUT_ENTROPY])


def test_async_reset_and_step_run_like_sync_ones():
    tok = chatml_tokenizer()
    sync, run_async = (EpisodeRunner(ContextGenerator(tok), tok, env, "x:E", EpisodeLimits(4, 200, 60.0)).run(
        [{"prompt": "hi"}, {"prompt": "yo"}], [[1]] * 2, 1, SamplingParams(max_new_tokens=50), None)
        for env in (ThreeTurnEnv, AsyncThreeTurnEnv))
    assert torch.equal(sync[col.INPUT_IDS], run_async[col.INPUT_IDS])
    assert torch.equal(sync[col.RESPONSE_MASK], run_async[col.RESPONSE_MASK])
    assert [e["return"] for e in sync[col.EPISODE]] == [e["return"] for e in run_async[col.EPISODE]] == [6.0, 6.0]


def test_first_messages_longer_than_max_prompt_length_are_a_user_error():
    tok = chatml_tokenizer()
    runner = EpisodeRunner(ScriptedGenerator(tok), tok, ThreeTurnEnv, "m:E",
                           EpisodeLimits(3, 100, 60.0, max_prompt_tokens=10))
    with pytest.raises(UserError, match=r"rollout.env 'm:E': reset\(\) gave first messages of \d+ tokens, over "
                                        r"data.max_prompt_length=10; raise data.max_prompt_length to at least"):
        runner.run([{"prompt": "a long question"}], [[1]], 1, SamplingParams(max_new_tokens=5), None)


class HermesGenerator(ScriptedGenerator):
    """'Samples' SmolLM2-style turns: two Hermes calls, then the answer, each ending in <|im_end|>."""

    TURNS = ['<tool_call>{"name": "calculator", "arguments": {"expression": "47 * 86"}}</tool_call>',
             '<tool_call>{"name": "calculator", "arguments": {"expression": "4042 + 0"}}</tool_call>',
             "The answer is 4042."]

    def turn_ids(self, episode: int, turn: int) -> list[int]:
        return self.tok(self.TURNS[turn], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]


@pytest.mark.slow
def test_three_turns_with_smollm2_s_own_tokenizer_and_chat_template(smollm2_model):
    """The acceptance test on a real chat model's BPE tokenizer and template (SmolLM2-135M-Instruct,
    ChatML): the trained ids are exactly the sampled ones, the tool's messages sit between them with
    mask 0, and prompt + response decode to the template's rendering of the whole conversation."""
    from hflow.recipes.envs.arithmetic_tool import ArithmeticToolEnv

    tok = load_tokenizer(str(smollm2_model))
    gen = HermesGenerator(tok)
    row = {"prompt": [{"role": "user", "content": "What is 47 * 86? Answer with a number."}], "answer": "4042"}
    out = EpisodeRunner(gen, tok, ArithmeticToolEnv, "x:E", EpisodeLimits(3, 300, 60.0)).run(
        [row], [[1]], 1, SamplingParams(max_new_tokens=60), None)
    (episode,) = out[col.EPISODE]
    assert episode["ended"] == "done" and episode["return"] == 1.0 and episode["tool_calls"] == 2
    real = out[col.ATTENTION_MASK][0, -out[col.RESPONSES].shape[1]:].bool()
    response = out[col.RESPONSES][0][real].tolist()
    trained = out[col.RESPONSE_MASK][0][real].bool().tolist()
    assert [t for t, m in zip(response, trained) if m] == sum((gen.turn_ids(0, t) for t in range(3)), [])
    observations = [t for t, m in zip(response, trained) if not m]
    assert "4042" in tok.decode(observations) and "<|im_start|>tool" in tok.decode(observations)
    prompt = out[col.INPUT_IDS][0][out[col.ATTENTION_MASK][0].bool()].tolist()[:-len(response)]
    starts = [i for i in range(len(response)) if trained[i] and (i == 0 or not trained[i - 1])]
    assert [c[0] for c in gen.contexts] == [prompt + response[:start] for start in starts]  # never re-tokenized
    conversation = ArithmeticToolEnv().reset(row)
    for turn, text in enumerate(HermesGenerator.TURNS):
        conversation.append({"role": "assistant", "content": text})
        if turn < 2:
            conversation.append({"role": "tool", "content": "4042"})
    assert tok.decode(prompt + response) == tok.apply_chat_template(conversation, tokenize=False).rstrip("\n")
