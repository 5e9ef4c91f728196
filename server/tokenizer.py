"""Loading the model's tokenizer and turning output ids back into text."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.errors import ModelLoadError


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
        return list(self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
