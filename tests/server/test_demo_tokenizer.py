"""The demo checkpoint's tokenizer loads with transformers 4.46+ as well as 5 (issue 15, item 7)."""
from __future__ import annotations

import json

from server.models.demo import DEFAULT_CHAT_TEMPLATE


def test_demo_tokenizer_config_names_a_class_transformers_4_and_5_both_have(tiny_checkpoint):
    config = json.loads((tiny_checkpoint("llama") / "tokenizer_config.json").read_text())
    # "TokenizersBackend" (what transformers 5 writes) is a ValueError in transformers 4.x.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    # 4.x before 4.50 reads the template from here only, not from chat_template.jinja.
    assert config["chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert "backend" not in config


def test_demo_tokenizer_loads_and_renders_an_agent_history(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint("llama")))
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}
    text = tok.apply_chat_template([{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": None, "tool_calls": [call]},
                                    {"role": "tool", "content": "42", "tool_call_id": "c1"}],
                                   tokenize=False, add_generation_prompt=True)
    assert "<tool_call>lookup {\"q\": 1}</tool_call>" in text and "<|im_start|>tool\n42<|im_end|>" in text
    assert "None" not in text
