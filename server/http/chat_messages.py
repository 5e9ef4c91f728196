"""Chat histories as agent frameworks send them, checked and shaped for the tokenizer's chat template.

Roles system, developer, user, assistant and tool; an assistant turn may carry `tool_calls` with
`content: null`, and a tool turn answers one by `tool_call_id`. Each message keeps only the keys
a template reads, so a template sees OpenAI's shapes and nothing a client made up.
"""
from __future__ import annotations

from typing import Any

from server.errors import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    # The OpenAI SDK's own assistant message, appended to the history as agents do, holds these too.
    "assistant": {"role", "content", "name", "tool_calls", "reasoning_content", "refusal", "function_call", "audio",
                  "annotations"},
    "tool": {"role", "content", "name", "tool_call_id"},
}
# Arguments apply_chat_template takes itself; a client's chat_template_kwargs may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "self", "conversation", "messages", "chat_template", "tokenize", "add_generation_prompt",
    "continue_final_message", "tools", "documents", "return_dict", "return_tensors", "return_assistant_tokens_mask",
    "padding", "truncation", "max_length", "tokenizer_kwargs", "sanitize_control_tokens"})
FIELD = "messages"
# Assistant-message fields accepted only as null (or empty): what they carry cannot be rendered here.
NULL_ONLY = ("function_call", "audio", "annotations")


def parse_messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("messages must be a non-empty array", FIELD)
    return [_message(i, m) for i, m in enumerate(raw)]


def template_kwargs(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    clash = sorted(RESERVED_TEMPLATE_KWARGS & set(raw))
    if clash:
        raise InvalidRequestError(f"chat_template_kwargs may not set {clash[0]!r}: the server sets it",
                                  "chat_template_kwargs")
    return dict(raw)


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise InvalidRequestError(f"{where} needs a role, one of {', '.join(ROLES)}", FIELD)
    role = m["role"]
    extra = sorted(set(m) - MESSAGE_KEYS[role])
    if extra:
        raise InvalidRequestError(f"{where}: a {role} message has no field {extra[0]!r}", FIELD)
    out: dict[str, Any] = {"role": role, "content": _content(where, role, m)}
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if role == "assistant" and m.get("tool_calls") is not None:
        out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(_list(where, m))]
    for key in ("reasoning_content", "refusal"):  # passed on: the template decides whether to show them
        if role == "assistant" and isinstance(m.get(key), str):
            out[key] = m[key]
    if role == "assistant" and (bad := next((k for k in NULL_ONLY if m.get(k)), None)) is not None:
        raise InvalidRequestError(f"{where}: {bad} is not supported in the history (null only)", FIELD)
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequestError(f"{where}: a tool message needs tool_call_id (a string)", FIELD)
        out["tool_call_id"] = call_id
    return out


def _content(where: str, role: str, m: dict[str, Any]) -> str | None:
    content = m.get("content")
    if content is None and role == "assistant" and (m.get("tool_calls") or m.get("refusal")):
        return None  # OpenAI's shape of a turn that only calls tools
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise InvalidRequestError(f"{where}: only text content parts are supported", FIELD)
        return "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InvalidRequestError(f"{where}: content must be a string or a list of text parts "
                                  "(null only on an assistant turn with tool_calls)", FIELD)
    return content


def _list(where: str, m: dict[str, Any]) -> list[Any]:
    calls = m["tool_calls"]
    if not isinstance(calls, list):
        raise InvalidRequestError(f"{where}: tool_calls must be an array", FIELD)
    return calls


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequestError(f"{where} needs function.name (a string)", FIELD)
    arguments = function.get("arguments", "")
    if not isinstance(arguments, (str, dict)):
        raise InvalidRequestError(f"{where}: function.arguments must be a JSON string (or an object)", FIELD)
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}: id must be a string", FIELD)
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}}
