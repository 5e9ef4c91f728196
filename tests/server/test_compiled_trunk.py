"""The inductor-compiled trunk (`--torch-compile`): compiled once at start-up, never again while serving,
equal to eager up to float rounding, recorded in the log, refused where it cannot run."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from commitlog.codec import Kind
from commitlog.reader import LogReader
from server.errors import ConfigError
from server.forward_batch import ForwardMode
from server.models.demo import CheckpointSpec, build_checkpoint
from server.models.loader import load_model
from server.models.packed_linear import PackedLinear, apply_linear_backend, onednn_available
from server.models.transposed_linear import TransposedLinear, transpose_linears

GREEDY = {"temperature": 0, "ignore_eos": True}


def _workload(vocab: int, n: int = 12) -> tuple[list[list[int]], list[dict[str, object]]]:
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 90, (n,), generator=g).tolist()
    prompts = [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lens]
    params = [{"max_new_tokens": int(m), **GREEDY} for m in torch.randint(1, 24, (n,), generator=g)]
    return prompts, params


@pytest.mark.parametrize("threads", [{}, {"num_threads": 1, "prefill_threads": 2},
                                     {"num_threads": 2, "small_decode_rows": 8}],
                         ids=["one-count", "prefill-threads", "small-decode-rows"])
def test_compiled_trunk_serves_decode_extend_and_mixed_batches_without_recompiling(tiny_checkpoint, make_engine,
                                                                                  threads):
    before = torch.get_num_threads()
    engine = make_engine(tiny_checkpoint("llama"), chunked_prefill_size=32, enable_mixed_chunk=True,
                         torch_compile="on", **threads)
    graphs_after_warm_up = counters["stats"]["unique_graphs"]
    prompts, params = _workload(500)
    try:
        engine.generate(input_ids=prompts[:1], sampling_params=params[:1])  # batch-1: one-token decodes
        engine.generate(input_ids=[[7]], sampling_params=params[:1])  # a one-token prompt: an extend over a KV of 1
        engine.generate(input_ids=prompts, sampling_params=params)
    finally:
        torch.set_num_threads(before)  # the engine set the process's count
    stats = engine.scheduler.stats
    assert all(stats.steps[mode] > 0 for mode in (ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.MIXED))
    # Every batch size, token count, KV length and slot offset ran on the graphs warm-up compiled.
    assert counters["stats"]["unique_graphs"] == graphs_after_warm_up


def test_compiled_trunk_outputs_equal_eager_outputs(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("qwen3")
    prompts, params = _workload(500)
    outs = {}
    for mode in ("off", "on"):
        engine = make_engine(model_dir, chunked_prefill_size=40, torch_compile=mode)
        got = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        outs[mode] = got
    for eager, compiled in zip(outs["off"], outs["on"]):
        assert compiled["output_ids"] == eager["output_ids"]
        lp_eager = [v for v, _, _ in eager["meta_info"]["output_token_logprobs"]]
        lp_compiled = [v for v, _, _ in compiled["meta_info"]["output_token_logprobs"]]
        assert torch.allclose(torch.tensor(lp_compiled), torch.tensor(lp_eager), atol=1e-4)


def test_a_second_model_of_the_same_shapes_runs_its_own_weights_through_the_shared_graphs(tmp_path, tiny_checkpoint,
                                                                                           make_engine):
    """The compiled graphs take the weights as inputs (they are shared by every model of one shape):
    a second checkpoint of the same shapes must produce its own tokens, not the first one's."""
    first = make_engine(tiny_checkpoint("llama"), torch_compile="on")
    other_dir = build_checkpoint(tmp_path / "other", CheckpointSpec(architecture="LlamaForCausalLM", seed=99))
    second = make_engine(other_dir, torch_compile="on")
    eager = make_engine(other_dir, torch_compile="off")
    prompts, params = _workload(500, n=4)
    want = [o["output_ids"] for o in eager.generate(input_ids=prompts, sampling_params=params)]
    assert [o["output_ids"] for o in second.generate(input_ids=prompts, sampling_params=params)] == want
    assert [o["output_ids"] for o in first.generate(input_ids=prompts, sampling_params=params)] != want


def test_warm_up_writes_no_slot_a_request_can_own(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), torch_compile="on")
    pool = engine.scheduler.kv_pool
    for buffers in (pool.k_buffers, pool.v_buffers):
        for layer in buffers:
            assert not layer[1:].any(), "warm-up wrote outside the padding slot 0"


def test_server_start_records_which_trunk_ran(tmp_path, tiny_checkpoint, make_engine):
    for mode, recorded in (("on", "inductor"), ("off", "eager")):
        log_dir = tmp_path / mode
        make_engine(tiny_checkpoint("llama"), torch_compile=mode, log_dir=str(log_dir)).shutdown()
        reader = LogReader.open(log_dir)
        try:
            start = next(r for r in reader.records() if r.kind is Kind.SERVER_START)
        finally:
            reader.close()
        assert start.payload["engine"]["compiled"] == recorded


@pytest.mark.parametrize("kwargs, why", [({"attention_backend": "torch"}, "attention"),
                                          ({"dtype": "bfloat16"}, "float32")])
def test_torch_compile_on_is_refused_where_the_compiled_trunk_cannot_run(kwargs, why, tiny_checkpoint, make_engine):
    with pytest.raises(ConfigError, match=why):
        make_engine(tiny_checkpoint("llama"), torch_compile="on", **kwargs)


def test_unknown_torch_compile_mode_is_refused(tiny_checkpoint, make_engine):
    with pytest.raises(ConfigError, match="--torch-compile"):
        make_engine(tiny_checkpoint("llama"), torch_compile="sometimes")


def test_compiled_trunk_runs_its_layers_on_transposed_weight_copies_and_keeps_the_lm_heads_layout(tiny_checkpoint,
                                                                                                 make_engine):
    model_dir = tiny_checkpoint("qwen2")  # Qwen2: q/k/v carry a bias, which the copy must keep
    eager = make_engine(model_dir, torch_compile="off").scheduler.runner.model
    compiled = make_engine(model_dir, torch_compile="on").scheduler.runner.model
    for layer_eager, layer_compiled in zip(eager.model.layers, compiled.model.layers):
        for path in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            plain, copy = layer_eager.get_submodule(path), layer_compiled.get_submodule(path)
            assert isinstance(plain, nn.Linear) and isinstance(copy, TransposedLinear), path
            assert copy.weight_t.is_contiguous() and torch.equal(copy.weight_t, plain.weight.t()), path
            assert (copy.bias is None) == (plain.bias is None), path
            if plain.bias is not None:
                assert torch.equal(copy.bias, plain.bias), path
    assert isinstance(compiled.lm_head, nn.Linear)  # it runs eager, where the checkpoint's layout keeps HF's bits


def test_transposed_linear_matches_nn_linear_for_any_row_count_and_leaves_packed_linears_alone(tiny_checkpoint):
    model_dir = tiny_checkpoint("qwen2")
    reference, swapped = load_model(model_dir, torch.float32), load_model(model_dir, torch.float32)
    linears = [m for m in reference.model.layers.modules() if isinstance(m, nn.Linear)]
    assert transpose_linears(swapped.model.layers) == len(linears) > 0
    copies = [m for m in swapped.model.layers.modules() if isinstance(m, TransposedLinear)]
    g = torch.Generator().manual_seed(0)
    for plain, copy in zip(linears, copies, strict=True):
        for rows in (0, 1, 7, 64):
            x = torch.randn(rows, plain.in_features, generator=g)
            with torch.inference_mode():
                torch.testing.assert_close(copy(x), plain(x), rtol=1e-5, atol=1e-5)
    if onednn_available(torch.float32):
        packed = load_model(model_dir, torch.float32)
        apply_linear_backend(packed, "onednn", torch.float32, 64)
        assert transpose_linears(packed.model.layers) == 0
        assert not any(isinstance(m, TransposedLinear) for m in packed.modules())
        assert any(isinstance(m, PackedLinear) for m in packed.modules())
