"""Tools for multi-turn episodes: Python functions as tool specs, tool calls parsed out of the
model's text, and calls run so that no tool can crash or hang a run.

    def add(a: int, b: int) -> int:
        '''Add two integers.

        a: the first number
        b: the second number
        '''
        return a + b

    tool_spec(add)  -> {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                        "parameters": {"type": "object", "properties": {"a": {"type": "integer", ...}}, ...}}}

The specs go to the chat template (`apply_chat_template(..., tools=...)`), which advertises
them in its own format where it has one. Calls are parsed with the tokenizer's own response
parser where it has one (a `response_template`: transformers' `parse_response`), else from the
Hermes/Qwen format `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (what Qwen2.5's,
Hermes' and many other templates ask the model to write); an environment with yet another
format overrides `ToolEnv.parse_calls`. A tool that raises, runs past its timeout, or returns more than
`max_output_chars` characters gives an error or a truncated observation, never a failed run; a
tool that raises `hflow.errors.UserError` (the set-up is wrong: no sandbox to run code in, its
server gone) stops the run with that one line instead, since the model is not at fault.
A timed-out tool's thread cannot be stopped (Python has no way to kill a thread): it is left
running as a daemon; use `code_tool.run_python` (a sandbox) for code that may not end.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import typing
from dataclasses import dataclass
from typing import Callable

from hflow.errors import UserError

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _json_type(annotation) -> dict:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        return {"type": "array", **({"items": _json_type(args[0])} if args else {})}
    if origin is typing.Literal:
        return {"type": "string", "enum": list(typing.get_args(annotation))}
    return {"type": _JSON_TYPES.get(origin or annotation, "string")}


def _doc_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph, and `name: text` lines (Google-style `Args:` too)."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ").strip()
    params = {}
    for line in doc.splitlines():
        m = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", line)
        if m and m.group(1) in inspect.signature(fn).parameters:
            params[m.group(1)] = m.group(2).strip()
    return summary, params


def tool_spec(fn: Callable) -> dict:
    """The JSON-schema tool spec of a function with type hints and a docstring (OpenAI's format,
    which transformers' chat templates take)."""
    summary, described = _doc_parts(fn)
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, param in inspect.signature(fn).parameters.items():
        prop = _json_type(hints.get(name, str))
        if name in described:
            prop["description"] = described[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "function", "function": {
        "name": fn.__name__, "description": summary,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_tool_calls(text: str) -> list[ToolCall | str]:
    """The Hermes-format calls in `text`, in order; a call that is not valid JSON with a `name`
    comes back as an error string (the model is told so in the observation)."""
    calls: list[ToolCall | str] = []
    for body in _CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(f"error: the tool call is not valid JSON ({err.msg})")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append('error: a tool call needs {"name": ..., "arguments": {...}}')
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append(ToolCall(data["name"], arguments if isinstance(arguments, dict) else {}))
    return calls


def template_tool_calls(tokenizer, text: str, tools: list[dict] | None = None) -> list[ToolCall | str]:
    """The calls in `text` by the tokenizer's `response_template` (transformers' `parse_response`);
    calls it cannot read come back as error strings."""
    try:
        message = tokenizer.parse_response(text, prefix="", tools=tools or None)
    except Exception as err:  # the model's malformed output is its observation, not a crash
        return [f"error: the response could not be parsed ({type(err).__name__}: {err})"]
    calls: list[ToolCall | str] = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else None
        arguments = fn.get("arguments", {}) if isinstance(fn, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(arguments, dict):
            calls.append('error: a tool call needs {"name": ..., "arguments": {...}}')
        else:
            calls.append(ToolCall(fn["name"], arguments))
    return calls


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n...[truncated: {len(text) - limit} more characters]"


class ToolRunner:
    """Runs tool calls by name, each in its own daemon thread with a timeout; errors, timeouts and
    huge outputs come back as observation text."""

    def __init__(self, functions: list[Callable], timeout_s: float = 10.0, max_output_chars: int = 4096):
        self.functions = {fn.__name__: fn for fn in functions}
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars

    def call(self, call: ToolCall | str) -> str:
        if isinstance(call, str):
            return call
        fn = self.functions.get(call.name)
        if fn is None:
            return f"error: no tool named {call.name!r} (tools: {', '.join(self.functions) or 'none'})"
        box: dict = {}

        def target():
            try:
                box["value"] = fn(**call.arguments)
            except UserError as err:  # the machine or the set-up, not the model's call: the run stops
                box["stop"] = err
            except BaseException as err:  # the tool's failure is the model's observation
                box["error"] = f"{type(err).__name__}: {err}"

        thread = threading.Thread(target=target, daemon=True, name=f"tool-{call.name}")
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return f"error: tool {call.name!r} timed out after {self.timeout_s:g} s"
        if "stop" in box:
            raise box["stop"]
        if "error" in box:
            return truncate(f"error: tool {call.name!r} raised {box['error']}", self.max_output_chars)
        value = box.get("value")
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return truncate(text, self.max_output_chars)


class ToolEnv:
    """A base class for environments whose turns are tool calls: a turn with calls gets their
    results as `tool` messages; a turn without one is the final answer, scored by `score`.

    Subclasses set `tools` (functions) and write `reset(row)` and `score(answer) -> float`;
    `tool_timeout_s`, `max_output_chars` and `parse_calls` may be overridden. `tool_calls`
    counts the calls of the episode (reported per episode in samples.jsonl and events.jsonl).
    The episode runner sets `tokenizer` (the actor's) before `reset`.
    """

    tools: list[Callable] = []
    tokenizer = None
    tool_timeout_s: float = 10.0
    max_output_chars: int = 4096

    def __init__(self):
        self.runner = ToolRunner(list(self.tools), self.tool_timeout_s, self.max_output_chars)
        self.tool_specs = [tool_spec(fn) for fn in self.tools]
        self.tool_calls = 0

    def parse_calls(self, text: str) -> list[ToolCall | str]:
        if getattr(self.tokenizer, "response_template", None):
            return template_tool_calls(self.tokenizer, text, self.tool_specs)
        return parse_tool_calls(text)

    def score(self, answer: str) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define score(answer) -> float")

    def step(self, assistant_text: str) -> tuple[list[dict], float, bool]:
        calls = self.parse_calls(assistant_text)
        if not calls:
            return [], self.score(assistant_text), True
        self.tool_calls += len(calls)
        return [{"role": "tool", "content": self.runner.call(c)} for c in calls], 0.0, False
