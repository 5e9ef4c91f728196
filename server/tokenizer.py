"""The model's tokenizer. Encode/decode use the `tokenizers` library directly (fast to
load, enough for the scheduler); the HF tokenizer, needed only for chat templates, is
loaded on first use or ahead of time by the server's start-up preload."""
from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.errors import InvalidRequestError, ModelLoadError

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] if m['content'] is not none else '' }}"
    "{% for c in m['tool_calls'] or [] %} [call {{ c['function']['name'] }}]{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


class Tokenizer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._hf: Any = None
        self._hf_lock = threading.Lock()
        fast_file = path / "tokenizer.json"
        if fast_file.is_file():
            from tokenizers import Tokenizer as FastTokenizer

            try:
                self._fast: Any = FastTokenizer.from_file(str(fast_file))
            except Exception as exc:  # noqa: BLE001 - any parse failure is a bad model directory
                raise ModelLoadError(f"cannot load {fast_file}: {exc}") from exc
            self._eos = self._configured_eos()
        else:  # a slow-only tokenizer: everything goes through transformers
            self._fast = None
            self._eos = self._load_hf().eos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str) -> list[int]:
        if self._fast is None:
            return list(self._load_hf().encode(text, add_special_tokens=True))
        return list(self._fast.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> str:
        """`spaces_between_special_tokens` acts where transformers honours it (slow tokenizers); a
        fast tokenizer's decoder places special tokens its own way, as SGLang's decode does too."""
        if self._fast is None:
            return str(self._load_hf().decode(list(ids), skip_special_tokens=skip_special_tokens,
                                              spaces_between_special_tokens=spaces_between_special_tokens))
        return str(self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. a special token), or None if it has none."""
        if self._fast is None:
            found = self._load_hf().convert_tokens_to_ids(token)
            return None if found is None or found == self._load_hf().unk_token_id else int(found)
        found = self._fast.token_to_id(token)
        return None if found is None else int(found)

    def hf_tokenizer(self) -> Any:
        """The transformers tokenizer (loaded on first use): xgrammar builds its vocabulary from it."""
        return self._load_hf()

    def apply_chat_template(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
                            ) -> list[int]:
        """The prompt ids of a chat; a template that cannot render these messages is the request's
        fault (a role order it refuses, a shape it does not read): InvalidRequestError naming messages."""
        from jinja2 import TemplateError  # transformers renders templates with jinja2

        hf = self._load_hf()
        # A tokenizer without a template gets a plain role-tagged one rather than an error.
        template = hf.chat_template or PLAIN_CHAT_TEMPLATE
        if not isinstance(template, str):  # a dict of named templates: the default one
            template = template.get("default") or PLAIN_CHAT_TEMPLATE
        if "developer" not in template:
            # OpenAI's developer role is its system role renamed; most templates know only "system".
            messages = [m | {"role": "system"} if m["role"] == "developer" else m for m in messages]
        try:
            text = hf.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                          tokenize=False, **(template_kwargs or {}))
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidRequestError(f"the model's chat template cannot render these messages: "
                                      f"{type(exc).__name__}: {exc}", "messages") from None
        return list(hf.encode(text, add_special_tokens=False))

    def _load_hf(self) -> Any:
        with self._hf_lock:
            if self._hf is None:
                from transformers import AutoTokenizer

                try:
                    self._hf = AutoTokenizer.from_pretrained(str(self.path))
                except (OSError, ValueError) as exc:
                    raise ModelLoadError(f"cannot load a tokenizer from {self.path}: {exc}") from exc
            return self._hf

    def _configured_eos(self) -> int | None:
        config = self.path / "tokenizer_config.json"
        if not config.is_file():
            return None
        eos = json.loads(config.read_text()).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        return self._fast.token_to_id(eos) if isinstance(eos, str) else None
