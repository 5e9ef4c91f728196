"""The field contract of the request bodies, stated once.

Every field SGLang or OpenAI documents for a route is, here, either implemented, accepted only
at its neutral value (the value that changes nothing, which real clients send by habit:
`lora_path: null`, `n: 1`, `frequency_penalty: 0.0`), or refused; any other name is unknown.
Each refusal is a 400 naming the field, so nothing is ever silently ignored. `docs/api.md`'s
table is rendered from these tables (`python -m server.api_fields --write docs/api.md`; a test
keeps the two equal).
"""
from __future__ import annotations

import enum
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.errors import InvalidRequestError


class Support(enum.Enum):
    IMPLEMENTED = "implemented"
    NEUTRAL_ONLY = "neutral-only"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class FieldRule:
    support: Support
    # NEUTRAL_ONLY: the values accepted. `null` is read as "absent" for every field, as SGLang and
    # OpenAI read it, so it is accepted everywhere and need not be listed.
    neutral: tuple[object, ...] = ()
    why: str = ""  # shown in the 400 and in the docs table


def implemented(why: str = "") -> FieldRule:
    return FieldRule(Support.IMPLEMENTED, (), why)


def neutral(*values: object, why: str) -> FieldRule:
    return FieldRule(Support.NEUTRAL_ONLY, values, why)


def refused(why: str) -> FieldRule:
    return FieldRule(Support.REFUSED, (), why)


@dataclass(frozen=True)
class Surface:
    """One body (or nested object) and the rule of each field it may hold."""

    title: str
    rules: Mapping[str, FieldRule]
    prefix: str = ""  # how messages name a nested field: "sampling_params."

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.rules)

    def implemented(self) -> frozenset[str]:
        return frozenset(n for n, r in self.rules.items() if r.support is Support.IMPLEMENTED)

    def check(self, body: Mapping[str, object]) -> None:
        """Unknown names and non-neutral values are a 400 naming the field; implemented fields are
        checked by the code that implements them."""
        unknown = sorted(name for name in body if name not in self.rules)
        if unknown:
            raise InvalidRequestError(f"unknown field {self.prefix}{unknown[0]}: this route does not know it "
                                      f"(docs/api.md lists every field it takes)", unknown[0])
        for name, value in body.items():
            rule = self.rules[name]
            if value is None or rule.support is Support.IMPLEMENTED:
                continue
            if rule.support is Support.NEUTRAL_ONLY and any(same_value(value, v) for v in rule.neutral):
                continue
            raise InvalidRequestError(refusal(self.prefix + name, rule), name)


def refusal(name: str, rule: FieldRule) -> str:
    if rule.support is Support.REFUSED:
        return f"{name} is not supported: {rule.why}"
    values = " or ".join(json.dumps(v) for v in rule.neutral)
    return f"{name} is accepted only at its neutral value {values}: {rule.why}"


def same_value(value: object, neutral_value: object) -> bool:
    """Equality that keeps JSON's types apart: `true` is not `1`, and `0` equals `0.0`."""
    if isinstance(value, bool) or isinstance(neutral_value, bool):
        return type(value) is type(neutral_value) and value == neutral_value
    if isinstance(neutral_value, (int, float)):
        return isinstance(value, (int, float)) and value == neutral_value
    return type(value) is type(neutral_value) and value == neutral_value


# Sampling controls another change is implementing (issue 15, item 3). Until it lands they are
# accepted at their neutral value only. Dropping an entry here makes the field implemented on every
# surface that lists it (a test fails while a SamplingParams field is still listed, to say so).
AWAITING: dict[str, object] = {}  # every field once listed here is implemented now
AWAITING_WHY = "not implemented yet"


def awaiting(name: str) -> dict[str, FieldRule]:
    """The rule of a field in AWAITING: neutral-only while listed, implemented once its entry is dropped."""
    if name not in AWAITING:
        return {name: implemented()}
    value = AWAITING[name]
    return {name: FieldRule(Support.NEUTRAL_ONLY, () if value is None else (value,), AWAITING_WHY)}


def awaiting_rules(*names: str) -> dict[str, FieldRule]:
    return {k: v for name in names for k, v in awaiting(name).items()}


NO_LORA = "no LoRA adapters are loaded here; null serves the base model"
NO_MULTIMODAL = "this server serves text models only"
NO_DISAGG = "no prefill/decode disaggregation here (one server serves both)"

SAMPLING = Surface("`sampling_params` (native)", {
    **{name: implemented() for name in (
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
        "skip_special_tokens", "json_schema", "regex", "ebnf")},
    "seed": implemented("per-request seed (SGLang's name is sampling_seed)"),
    **awaiting_rules("min_new_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
                "sampling_seed", "no_stop_trim", "spaces_between_special_tokens"),
    "n": neutral(1, why="one sample per prompt on /generate; send a batch, or use n on the OpenAI routes"),
    "stream_interval": neutral(1, why="every durable step is streamed"),
    "stop_regex": neutral([], why="stop strings only (use regex to constrain the output)"),
    "structural_tag": refused("use json_schema, regex or ebnf"),
    "custom_params": refused("custom logit processors are not supported"),
}, prefix="sampling_params.")

GENERATE = Surface("`POST /generate`", {
    **{name: implemented() for name in (
        "text", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num", "logprob_start_len",
        "return_hidden_states", "stream", "rid")},
    "lora_path": neutral(why=NO_LORA),
    "lora_id": neutral(why=NO_LORA),
    "return_routed_experts": neutral(False, why="no mixture-of-experts routing is recorded"),
    "return_text_in_logprobs": neutral(False, why="logprob entries carry null text; decode the ids"),
    "token_ids_logprob": neutral(why="logprobs of chosen token ids are not supported"),
    "custom_logit_processor": neutral(why="custom logit processors are not supported"),
    "data_parallel_rank": neutral(0, why="one data-parallel rank"),
    "routed_dp_rank": neutral(0, why="one data-parallel rank"),
    **{name: neutral(why=NO_DISAGG) for name in (
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key")},
    "log_metrics": neutral(True, why="every request is counted in /metrics"),
    "priority": neutral(why="requests are admitted first come, first served"),
    "session_params": neutral(why="no sessions; send the whole prompt"),
    "extra_key": neutral(why="no prefix-cache salt"),
    "no_logs": neutral(False, why="every request is in the write-ahead log, by design"),
    "return_bytes": neutral(False, why="text is returned as a string"),
    "return_entropy": neutral(False, why="entropy is not computed"),
    "background": neutral(False, why="requests run while their client waits"),
    "conversation_id": neutral(why="no conversation state"),
    "custom_labels": neutral(why="metrics carry no per-request labels"),
    **{name: refused(NO_MULTIMODAL) for name in (
        "image_data", "video_data", "audio_data", "input_embeds", "modalities")},
})


def main(argv: list[str] | None = None) -> None:
    """Prints the docs tables; `--write docs/api.md` puts them between that file's markers."""
    from server.http.metrics import render_name_mapping
    from server.http.openai_fields import CHAT, COMPLETIONS

    blocks = {"fields": render_tables([GENERATE, SAMPLING, COMPLETIONS, CHAT]), "metric-names": render_name_mapping()}
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["--write"] or len(args) != 2:
        print("\n".join(blocks.values()))
        return
    path = Path(args[1])
    text = path.read_text()
    for name, block in blocks.items():
        def between_markers(m: re.Match[str], block: str = block) -> str:
            return m.group(1) + block + m.group(2)

        text = re.sub(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", between_markers, text, flags=re.S)
    path.write_text(text)


def render_tables(surfaces: list[Surface]) -> str:
    return "\n\n".join(render_table(s) for s in surfaces) + "\n"


def render_table(surface: Surface) -> str:
    rows = [f"### {surface.title}", "", "| field | support | accepted | note |", "| --- | --- | --- | --- |"]
    order = list(Support)
    for name, rule in sorted(surface.rules.items(), key=lambda kv: (order.index(kv[1].support), kv[0])):
        accepted = {Support.IMPLEMENTED: "any valid value", Support.REFUSED: "null / absent",
                    Support.NEUTRAL_ONLY: " or ".join(["null", *(json.dumps(v) for v in rule.neutral)])}
        rows.append(f"| `{name}` | {rule.support.value} | {accepted[rule.support]} | {rule.why} |")
    return "\n".join(rows)


if __name__ == "__main__":
    # Through the imported module: run as __main__, this file's Support is not the one the
    # OpenAI tables were built with.
    from server import api_fields

    api_fields.main()
