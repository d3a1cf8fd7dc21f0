"""`after_user`: what `tool_choice: auto` becomes under `[server] auto_tool_choice = "required_after_user"`."""

from __future__ import annotations

from liveloop.server.edge.formats.tools import Tool, ToolChoice, after_user

TOOLS = [Tool.offered("exec_command", "Run a command.", {"type": "object", "properties": {"cmd": {"type": "string"}}}, None)]
USER = {"role": "user", "content": "List the files."}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}


def test_a_reply_to_the_user_must_call_a_tool():
    assert after_user([USER], TOOLS, ToolChoice("auto")) == ToolChoice("required")
    # a system turn after the user's (Claude Code sends them mid-conversation) does not change whose turn it answers
    assert after_user([{"role": "system", "content": "s"}, USER, {"role": "system", "content": "reminder"}], TOOLS, ToolChoice("auto")).mode == "required"
    assert after_user([USER, CALL, RESULT, {"role": "user", "content": "And now?"}], TOOLS, ToolChoice("auto")).mode == "required"


def test_a_reply_to_a_tool_result_decides_itself():
    assert after_user([USER, CALL, RESULT], TOOLS, ToolChoice("auto")) == ToolChoice("auto")


def test_other_choices_and_no_tools_stay_as_asked():
    for choice in (ToolChoice("none"), ToolChoice("required"), ToolChoice("named", "exec_command")):
        assert after_user([USER], TOOLS, choice) == choice
    assert after_user([USER], [], ToolChoice("auto")) == ToolChoice("auto")
    assert after_user([], TOOLS, ToolChoice("auto")) == ToolChoice("auto")
