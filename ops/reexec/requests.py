"""A logged BEGIN back to the `Req` the scheduler ran: prompt ids, sampling params, seed, grammar."""
from __future__ import annotations

import json
from typing import Any

from ops.reexec.plan import LoggedRequest
from server.errors import TokenLedgerError
from server.grammar.spec import GrammarKind
from server.request import LogprobRequest, Req, RequestSpec
from server.sampling.params import SamplingParams
from server.sampling.sampler import INVERSE_CDF

_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                  "ignore_eos", "seed", "min_new_tokens", "frequency_penalty", "presence_penalty",
                  "repetition_penalty", "logit_bias", "no_stop_trim", "skip_special_tokens",
                  "spaces_between_special_tokens")
_LOGPROB_KEYS = ("return_logprob", "top_logprobs_num", "logprob_start_len", "return_hidden_states")
_GRAMMAR_FIELDS = {GrammarKind.JSON_SCHEMA: "json_schema", GrammarKind.REGEX: "regex", GrammarKind.EBNF: "ebnf"}


class NotReexecutableError(TokenLedgerError):
    """This request (or the log's record of it) cannot be re-run by this software."""


def request_from_log(logged: LoggedRequest, logged_sampler: str) -> Req:
    """The request exactly as BEGIN recorded it. A parameter this software does not know would be
    silently dropped, and the re-run would not be the logged one: it is refused by name instead.
    `logged_sampler`: SERVER_START's `sampler`; a sampled request drawn by another one is refused
    (its seed would draw other tokens here), a greedy one runs whatever drew the others."""
    params: dict[str, Any] = logged.params
    unknown = sorted(set(params) - set(_SAMPLING_KEYS) - set(_LOGPROB_KEYS))
    if unknown:
        raise NotReexecutableError(f"its BEGIN has sampling parameter(s) this software does not know: {unknown}")
    if params.get("seed") is None:
        raise NotReexecutableError("its BEGIN has no seed")
    values = {k: params[k] for k in _SAMPLING_KEYS if k in params}
    values["stop"] = tuple(values.get("stop", ()))
    values["stop_token_ids"] = tuple(values.get("stop_token_ids", ()))
    if "logit_bias" in values:  # logged as [[id, bias], ...]
        values["logit_bias"] = tuple((int(i), float(b)) for i, b in values["logit_bias"])
    if logged.grammar is not None:
        values[_grammar_field(logged.grammar)] = json.loads(logged.grammar)["source"]
    sampling = SamplingParams(**values)
    if not sampling.is_greedy and logged_sampler != INVERSE_CDF:
        raise NotReexecutableError(f"it was sampled by the {logged_sampler!r} sampler and this software draws by "
                                   f"{INVERSE_CDF!r}: its seed would draw other tokens here (greedy requests re-run)")
    logprob = LogprobRequest(**{k: params[k] for k in _LOGPROB_KEYS if k in params})
    return Req.from_spec(RequestSpec(logged.rid, list(logged.prompt), sampling, logprob))


def _grammar_field(spec: str) -> str:
    try:
        return _GRAMMAR_FIELDS[GrammarKind(json.loads(spec)["kind"])]
    except (ValueError, KeyError, TypeError):
        raise NotReexecutableError(f"its grammar spec {spec[:80]!r} is not one this software reads") from None
