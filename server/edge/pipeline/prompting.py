"""A chat-shaped request -> what the engine is asked: the conversation rendered by the model's chat
template with the tools it offers, and the constraint its reply samples under (tool choice `required`
or named, or a JSON response format), checked to compile and to be something the engine can do. The
endpoints (OpenAI chat, Anthropic messages, the Responses API) each turn their own request into the
stored message shape (server/edge/formats/tools.py) and a `ToolChoice`; everything after that is here, once.
What the client's text spells of the model's special tokens stays text (server/edge/pipeline/markers.py).
A template that renders no tools (plain ChatML) gets them, the calls and their results written into the
messages' text as Qwen's template writes them (server/edge/formats/tool_rendering.py).

Templating runs on the serving pipeline's prompt thread, never on the event loop; whether a constraint
compiles is checked after it, on the grammar thread, in a child process with a deadline
(server/edge/pipeline/grammar_check.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from liveloop.grammar import grammars_for
from liveloop.server.edge.formats.tool_parsers import PARSERS
from liveloop.server.edge.formats.tool_rendering import TextTools, default_system, tool_format
from liveloop.server.edge.pipeline.grammar_check import CheckerUnavailable, GrammarChecker, GrammarTooComplex
from liveloop.server.edge.pipeline.markers import Markers, PromptText
from liveloop.server.edge.formats.tools import (
    JSONLayout,
    JSONReply,
    Tool,
    ToolChoice,
    ToolsRefused,
    ToolUse,
    bounded,
    check_schema,
    json_constraint,
    takes_text_arguments,
    template_messages,
)


def model_vocab_size(model_dir: Path, tokenizer: Any) -> int:
    """The width of the model's logits (its config's vocab_size; a checkpoint may pad it past the
    tokenizer's), what a grammar's token masks cover."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer))
    except (OSError, ValueError, TypeError):
        return len(tokenizer)


class Prompter:
    def __init__(self, tokenizer: Any, model_dir: Path, parser: str, json_layout: JSONLayout, engine: Any, json_max_string: int = 0,
                 compile_seconds: float = 3.0):
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.template: str | None = getattr(tokenizer, "chat_template", None)
        tools = tool_format(self.template, parser)
        self.parser_name = tools.parser
        # a template that renders no tools: they go into the messages' text, as Qwen's template writes them
        self.text_tools = TextTools(default_system(self._plain)) if tools.in_text else None
        self.json_layout = json_layout
        self.json_max_string = json_max_string  # `[engine] json_max_string`: formats/tools.py `bounded`
        self.engine = engine  # what it can do: supports_constraints, sampling_extensions
        self.text_arguments = takes_text_arguments(self.template)
        self.markers = Markers(tokenizer)
        self.compile_seconds = compile_seconds
        self._checker: GrammarChecker | None = None
        self._making = threading.Lock()

    @property
    def checker(self) -> GrammarChecker:
        """The constraint compiler with a deadline (`start_checker`, or made on the first constraint)."""
        with self._making:
            if self._checker is None:
                vocab = model_vocab_size(self.model_dir, self.tokenizer)
                self._checker = GrammarChecker(grammars_for(str(self.model_dir), vocab, self.tokenizer).info, self.compile_seconds)
            return self._checker

    def start_checker(self) -> None:
        """Make the constraint checker and start its child in the background (the server's start), when
        the engine samples under constraints at all."""
        if self.engine.supports_constraints:
            self.checker.start()

    def close(self) -> None:
        with self._making:  # a checker being made now is closed too
            if self._checker is not None:
                self._checker.close()

    def _plain(self, messages: list[dict[str, Any]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    # -- tools --------------------------------------------------------------------------------------
    def tool_use(self, tools: list[Tool], choice: ToolChoice, parallel: bool, param: str = "tools") -> ToolUse | None:
        """The request's tools as this model family writes them; None when it offers none (then only
        `auto` or `none` may be asked). Raises ToolsRefused."""
        if not tools:
            if choice.mode in ("required", "named"):
                raise ToolsRefused(f"tool_choice `{choice.name or choice.mode}` needs `{param}`", "tool_choice")
            return None
        if self.parser_name is None:
            raise ToolsRefused(
                "this model has no tool-call format: its chat template writes calls in a syntax liveloop does not "
                "read, and [engine] tool_call_parser does not name one (hermes, llama3_json)", param, code="tools_unsupported",
            )
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ToolsRefused(f"{param}: function names must be unique", param)
        if choice.mode == "named" and choice.name not in names:
            raise ToolsRefused(f"tool_choice: `{choice.name}` is not one of the tools offered", "tool_choice")
        for i, t in enumerate(tools):
            check_schema(t.parameters, f"{param}.{i}.parameters")
        return ToolUse(tuple(tools), choice, parallel, PARSERS[self.parser_name](names))

    def constraint(self, tool_use: ToolUse | None, json_reply: JSONReply | None, param: str) -> str | None:
        """The one constraint the reply samples under: the forced call of `required` / a named tool
        choice, or the JSON of a response format (`json_reply`), its schema checked; None: free
        sampling. Whether it compiles is `check`'s (off the prompt thread). Raises ToolsRefused."""
        param = "tools" if json_reply is None else param
        try:
            forced = tool_use.bounded(self.json_max_string).constraint(self.json_layout) if tool_use is not None else None
            if forced is not None and json_reply is not None:
                raise ToolsRefused("a forced tool call (tool_choice required or named) and a JSON response format cannot both hold", "tool_choice")
            if json_reply is not None:
                if json_reply.schema is not None:
                    check_schema(json_reply.schema, param)
                forced = json_constraint(bounded(json_reply.schema, self.json_max_string), self.json_layout)
        except ToolsRefused:
            raise
        except Exception as exc:  # a schema the structural tag cannot express
            raise _unfollowable(param, str(exc)[:300]) from None
        if forced is None:
            return None
        if not self.engine.supports_constraints:
            raise ToolsRefused(
                f"the {self.engine.name} engine does not serve constrained decoding (forced tool calls, JSON output)",
                "tool_choice" if json_reply is None else param, code="unsupported_by_engine",
            )
        return forced

    def check(self, constraint: str, param: str) -> None:
        """Raise ToolsRefused (naming `param`) unless `constraint` compiles within the deadline (blocks
        up to it: run it off the prompt thread and the event loop)."""
        try:
            self.checker.check(constraint)
        except GrammarTooComplex as exc:
            raise _unfollowable(param, str(exc), "grammar_too_complex") from None
        except CheckerUnavailable:  # the server's state (stopping), not the schema's: a 503 at the edge
            raise
        except Exception as exc:  # xgrammar refuses a schema it cannot turn into a grammar
            raise _unfollowable(param, str(exc)[:300]) from None

    # -- the prompt ---------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tool_use: ToolUse | None, generation_prompt: bool = True) -> PromptText:
        """The prompt's text: `messages` (stored shape) through the chat template, the offered tools
        with them, and where in it their text typed a special token's (server/edge/pipeline/markers.py;
        server/edge/pipeline/splicing.py tokenizes it). Raises ToolsRefused when the template refuses the
        conversation."""
        if self.template is None:
            raise ToolsRefused("this model has no chat template: use /v1/completions", "messages")
        kwargs: dict[str, Any] = {"add_generation_prompt": generation_prompt, "tokenize": False}
        # a sampled call's arguments go back as their text where the template (or text_tools) writes text as it is
        conversation = list(messages) if self.text_tools is not None else template_messages(messages, self.text_arguments)
        tools = tool_use.definitions() if tool_use is not None else None
        masker = self.markers.masker(conversation, tools, context=str(self.template))
        if masker is not None:  # typed markers go in as placeholders and come out as text
            conversation, tools = masker.mask(conversation), masker.mask(tools)
        if self.text_tools is not None:  # after masking: only what the client typed is masked
            conversation, tools = self.text_tools.messages(conversation, tools), None
        if tools is not None:
            kwargs["tools"] = tools
        try:
            text = self.tokenizer.apply_chat_template(conversation, **kwargs)
        except Exception as exc:  # the template refuses this conversation (its roles' order, say): the request's fault
            raise ToolsRefused(f"messages: the model's chat template refused them: {str(exc)[:200]}", "messages") from exc
        return PromptText(text) if masker is None else masker.unmask(text)


def _unfollowable(param: str, why: str, code: str = "invalid_value") -> ToolsRefused:
    """The refusal of a schema constrained decoding cannot follow (`constraint` and `check` alike)."""
    return ToolsRefused(f"{param}: constrained decoding cannot follow this schema: {why}", param, code=code)
