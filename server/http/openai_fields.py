"""The field contract of the OpenAI routes (see `server.api_fields` for what the three kinds mean)."""
from __future__ import annotations

from server.api_fields import FieldRule, Surface, awaiting_rules, implemented, neutral, refused

NO_TOOLS = "tool calling is not supported yet (no tool-call parser); tool messages in the history are fine"

COMMON: dict[str, FieldRule] = {
    **{name: implemented() for name in (
        "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n", "stream",
        "ignore_eos", "stop_token_ids", "skip_special_tokens", "regex", "json_schema", "ebnf")},
    "stream_options": implemented("include_usage, continuous_usage_stats"),
    "user": implemented("an end-user id (OpenAI: for abuse monitoring); it never changes the output"),
    **awaiting_rules("frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens",
                "no_stop_trim", "spaces_between_special_tokens"),
    "rid": implemented("SGLang's: the response id, and the request's key in the log; n > 1 choices are rid-i"),
    "best_of": neutral(1, why="one candidate per choice"),
    "session_params": neutral(why="no sessions; send the whole prompt"),
    "priority": neutral(why="requests are admitted first come, first served"),
    "data_parallel_rank": neutral(0, why="one data-parallel rank"),
    **{name: neutral(why="no prefill/decode disaggregation here (one server serves both)") for name in (
        "bootstrap_host", "bootstrap_port", "bootstrap_room")},
    "lora_path": neutral(why="no LoRA adapters are loaded here; null serves the base model"),
    "return_hidden_states": neutral(False, why="hidden states are returned on /generate only"),
}

COMPLETIONS = Surface("`POST /v1/completions`", {
    **COMMON,
    "prompt": implemented("a string, a list of strings, token ids, or a list of token-id lists"),
    "logprobs": implemented("top-k per output token, 0..20"),
    **awaiting_rules("echo"),
    "suffix": neutral("", why="insertion (text after the completion) is not supported"),
})

CHAT = Surface("`POST /v1/chat/completions`", {
    **COMMON,
    "messages": implemented("roles system, developer, user, assistant (content null with tool_calls), tool"),
    "logprobs": implemented(),
    "top_logprobs": implemented("0..20"),
    "max_completion_tokens": implemented(),
    "response_format": implemented("text, json_object, json_schema"),
    "chat_template_kwargs": implemented("extra variables for the tokenizer's chat template"),
    "separate_reasoning": neutral(True, why="with --reasoning-parser thinking is always in reasoning_content"),
    "stream_reasoning": neutral(True, why="thinking streams as it is generated"),
    "continue_final_message": neutral(False, why="the prompt always ends with a new assistant turn"),
    "tools": neutral([], why=NO_TOOLS),
    "tool_choice": neutral("none", why=NO_TOOLS),
    "parallel_tool_calls": neutral(True, False, why="moot without tools"),
    "functions": refused(NO_TOOLS),
    "function_call": neutral("none", why=NO_TOOLS),
    "store": neutral(False, why="completions are stored in the write-ahead log only"),
    "metadata": neutral({}, why="stored-completion metadata is not kept"),
    "service_tier": neutral("auto", "default", why="one service tier"),
    "modalities": neutral(["text"], why="text output only"),
    "reasoning_effort": refused("reasoning effort cannot be set; use --reasoning-parser to separate thinking"),
    "audio": refused("text output only"),
    "prediction": refused("predicted outputs are not supported"),
    "web_search_options": refused("no web search"),
})
