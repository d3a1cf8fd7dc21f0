import pytest
from pydantic import ValidationError

from liveloop.server.edge.auth import KeyRing, key_digest
from liveloop.server.config import AuthConfig
from liveloop.server.edge.chat.protocol import ChatCompletionRequest
from liveloop.server.edge.completions.protocol import CompletionRequest
from liveloop.server.edge.feedback.protocol import FeedbackRequest


@pytest.mark.parametrize("value, expected", [(1, 1), (0, 0), ("up", 1), ("down", 0)])
def test_reward_forms(value, expected):
    assert FeedbackRequest.model_validate({"response_id": "x", "reward": value}).reward == expected


@pytest.mark.parametrize("value", [2, -1, "meh", True, 0.5, None])
def test_bad_rewards(value):
    with pytest.raises(ValidationError):
        FeedbackRequest.model_validate({"response_id": "x", "reward": value})


def test_chat_rejects_unknown_fields_and_bad_values():
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ChatCompletionRequest.model_validate_json(__import__("json").dumps(ok))
    bad_tool = [{"type": "function", "function": {"name": "not a name"}}]
    for bad in ({"messages": []}, {"temperature": -0.1}, {"max_tokens": 0}, {"n": 0}, {"n": 17}, {"tools": bad_tool}, {"top_p": 0},
                {"tool_choice": "sometimes"}, {"response_format": {"type": "json_schema"}}, {"top_k": -2}, {"stop_token_ids": [-1]}):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate({**ok, **bad})


def test_completion_prompt_forms():
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["one"]}).prompt == "one"
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ""})


def test_keyring_sources_and_roles():
    cfg = AuthConfig(dev_user_keys=("u1",), admin_key_sha256=(key_digest("adm"),), user_keys_env="K_USERS")
    ring = KeyRing(cfg, environ={"K_USERS": "u2, u3"})
    assert not ring.resolve("u1").admin and ring.resolve("u3") is not None
    assert ring.resolve("adm").admin
    assert ring.resolve("nope") is None
    assert ring.resolve("u1").key_id == key_digest("u1")[:16]
    with pytest.raises(ValueError, match="no API keys"):
        KeyRing(AuthConfig(), environ={})
