"""Loading the model's tokenizer and turning output ids back into text."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.errors import ModelLoadError

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


class Tokenizer:
    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok: Any = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load a tokenizer from {path}: {exc}") from exc

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        # A tokenizer without a template gets a plain role-tagged one rather than an error.
        template = self._tok.chat_template or PLAIN_CHAT_TEMPLATE
        text = self._tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                             tokenize=False)
        return list(self._tok.encode(text, add_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        return str(self._tok.decode([token_id]))
