"""Tools: specs from type hints and docstrings, Hermes-format calls, and calls that raise, hang or
flood contained as observations."""

import threading
from typing import Literal

from hflow.engine.rollout.tools import ToolCall, ToolEnv, ToolRunner, parse_tool_calls, tool_spec


def add(a: int, b: float = 1.0, mode: Literal["exact", "round"] = "exact") -> float:
    """Add two numbers.

    a: the first number
    b: the second number
    """
    return a + b


def test_a_typed_function_becomes_a_json_schema_tool_spec():
    assert tool_spec(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "required": ["a"], "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "number", "description": "the second number"},
            "mode": {"type": "string", "enum": ["exact", "round"]}}}}}


def test_hermes_tool_calls_are_parsed_and_bad_ones_explained():
    text = ('I will add. <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{oops</tool_call>')
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("add", {"a": 1})]
    assert calls[2].startswith("error: the tool call is not valid JSON")
    assert parse_tool_calls("no call here") == []


def boom(x: int) -> int:
    """Always fails."""
    raise ValueError(f"bad x {x}")


RELEASE = threading.Event()


def hang() -> str:
    """Never returns on its own."""
    RELEASE.wait(60)
    return "late"


def flood() -> str:
    """Returns 10 MB."""
    return "x" * (10 << 20)


RUNNER = ToolRunner([add, boom, hang, flood], timeout_s=0.5, max_output_chars=2000)


def test_a_tool_that_raises_becomes_an_error_observation():
    assert RUNNER.call(ToolCall("boom", {"x": 3})) == "error: tool 'boom' raised ValueError: bad x 3"
    assert RUNNER.call(ToolCall("add", {"c": 1})).startswith("error: tool 'add' raised TypeError")
    assert RUNNER.call(ToolCall("nope", {})) == "error: no tool named 'nope' (tools: add, boom, hang, flood)"


def test_a_tool_that_hangs_times_out_as_an_observation():
    try:
        assert RUNNER.call(ToolCall("hang", {})) == "error: tool 'hang' timed out after 0.5 s"
    finally:
        RELEASE.set()


def test_ten_megabytes_of_tool_output_are_truncated():
    out = RUNNER.call(ToolCall("flood", {}))
    assert out.startswith("x" * 2000) and len(out) < 2100
    assert out.endswith(f"[truncated: {(10 << 20) - 2000} more characters]")


class AddEnv(ToolEnv):
    tools = [add, boom]

    def reset(self, row):
        return [{"role": "user", "content": "2 + 3?"}]

    def score(self, answer):
        return float("5" in answer)


def test_tool_env_turns_calls_into_tool_messages_and_scores_the_answer():
    env = AddEnv()
    assert env.tool_specs == [tool_spec(add), tool_spec(boom)]
    messages, reward, done = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                                      '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>')
    assert messages == [{"role": "tool", "content": "5"},
                        {"role": "tool", "content": "error: tool 'boom' raised ValueError: bad x 1"}]
    assert (reward, done, env.tool_calls) == (0.0, False, 2)
    assert env.step("it is 5") == ([], 1.0, True)


def test_a_tokenizer_s_own_response_parser_is_used_where_it_has_one():
    """transformers' `parse_response` with the tokenizer's `response_template` (here one for a
    `[call]...[/call]` format the Hermes fallback would not read) finds the calls."""
    from hflow.engine.models.loading import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.response_template = {"start_anchor": "assistant: ", "defaults": {"role": "assistant"}, "fields": {
        "content": {}, "tool_calls": {"open": "[call]", "close": "[/call]", "content": "json", "repeats": True}}}
    env = AddEnv()
    env.tokenizer = tok
    text = 'sum: [call]{"name": "add", "arguments": {"a": 2, "b": 3}}[/call]'
    assert parse_tool_calls(text) == []
    assert env.parse_calls(text) == [ToolCall("add", {"a": 2, "b": 3})]
    assert env.step(text) == ([{"role": "tool", "content": "5"}], 0.0, False)
