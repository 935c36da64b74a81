"""What serving engines' generic "transformers backend" (vLLM, SGLang) needs from a custom model, tested without the
engines: `auto_map["AutoModel"]`, keyword arguments flowing from the backbone to the attention function, attention
called once per layer through `ALL_ATTENTION_FUNCTIONS` with a number for `scaling`, an integer `layer_idx` and an
`is_causal` on each attention module, and positions taken from `position_ids` alone (packed rows, no mask, no cache)."""

import ast
import inspect
import json
import textwrap

import pytest
import torch
from transformers import AttentionInterface, DataCollatorWithFlattening
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification, TurnerModel
from turner_tfm.modeling_turner import TurnerAttention

from .tiny import image_config, random_ids, text_config

CPU_IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]


def packed_cases(position_embedding_types: list[str]) -> list:
    """Each position type under each implementation, but rotary under flex attention: a position type is Turner's
    code before the attention function, the same under every implementation (rotary's restarts are checked under
    eager and sdpa), and flex attention's packed mask is the same under every position type (checked under the
    others). Rotary's keys would only make flex attention compile its kernel once more (~20-35 s on 2 CPU cores):
    rotated keys are contiguous, the others are views of `qkv_proj`'s output, and a new stride is a new kernel."""
    return [
        pytest.param(position_embedding_type, implementation, id=f"{position_embedding_type}-{implementation}")
        for implementation in CPU_IMPLEMENTATIONS
        for position_embedding_type in position_embedding_types
        if (position_embedding_type, implementation) != ("rotary", "flex_attention")
    ]


def test_a_saved_checkpoint_names_the_backbone_for_auto_model(tmp_path):
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map.get("AutoModel") == "modeling_turner.TurnerModel"


def test_the_backbone_declares_support_for_engines_attention():
    assert TurnerModel._supports_attention_backend is True


def attention_calls(forward_source: str) -> tuple[list[ast.Call], set[str]]:
    """The calls of the local variable bound to `ALL_ATTENTION_FUNCTIONS...`, and that variable's names."""
    tree = ast.parse(textwrap.dedent(forward_source))
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "ALL_ATTENTION_FUNCTIONS" in ast.unparse(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
    ]
    return calls, names


def test_attention_is_called_once_through_the_interface_with_a_scaling_attribute():
    calls, names = attention_calls(inspect.getsource(TurnerAttention.forward))
    assert names == {"attention_interface"} and len(calls) == 1
    scaling = next(keyword.value for keyword in calls[0].keywords if keyword.arg == "scaling")
    assert ast.unparse(scaling).startswith("self.") or isinstance(scaling, ast.Constant)
    assert any(keyword.arg is None for keyword in calls[0].keywords)  # **kwargs reach the attention function


@pytest.mark.parametrize(
    ("model", "causal"),
    [
        (TurnerForCausalLM(text_config()), True),
        (TurnerForSequenceClassification(text_config(is_causal=False)), False),
        (TurnerForImageClassification(image_config()), False),
    ],
)
def test_every_attention_module_has_an_integer_layer_index_and_the_mask_kind(model, causal):
    attentions = [m for m in model.modules() if isinstance(m, TurnerAttention)]
    assert [m.layer_idx for m in attentions] == list(range(model.config.num_hidden_layers))
    assert all(type(m.layer_idx) is int and m.is_causal is causal for m in attentions)


def test_a_registered_attention_function_gets_every_layer_and_the_callers_kwargs():
    calls = []

    def recording_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        calls.append((module.layer_idx, scaling, kwargs.get("engine_metadata")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)

    AttentionInterface.register("turner_test_recording", recording_attention)
    torch.manual_seed(0)
    reference = TurnerForCausalLM(text_config()).eval()
    model = TurnerForCausalLM(text_config(attn_implementation="turner_test_recording")).eval()
    model.load_state_dict(reference.state_dict())
    ids, metadata = random_ids(2, 7), {"block_table": [3, 1]}
    with torch.no_grad():
        logits = model(ids, engine_metadata=metadata).logits
        torch.testing.assert_close(logits, reference(ids).logits)
    scaling = model.config.head_dim**-0.5
    assert calls == [(layer, scaling, metadata) for layer in range(model.config.num_hidden_layers)]
    assert all(type(call[1]) is float for call in calls)


def each_alone(model: torch.nn.Module, sequences: list[list[int]]) -> list:
    """`model`'s outputs for each sequence alone, the reference a packed row must match: under SDPA (attention
    implementations agree: tests/test_modeling.py), since flex attention on the CPU would compile for each length."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        return [model(torch.tensor([sequence])) for sequence in sequences]
    finally:
        model.set_attn_implementation(implementation)


@pytest.mark.parametrize(
    ("position_embedding_type", "implementation"), packed_cases(["learned", "sinusoidal", "rotary", "none"])
)
def test_a_packed_row_gives_each_sequence_its_own_logits(position_embedding_type, implementation):
    """One row, `position_ids` restarting at each sequence, no attention mask, no cache: what an engine sends."""
    sequences = [random_ids(1, length, seed=seed)[0].tolist() for seed, length in ((1, 5), (2, 9), (3, 3))]
    packed = DataCollatorWithFlattening()([{"input_ids": sequence} for sequence in sequences])
    assert packed["input_ids"].shape == (1, 17) and "attention_mask" not in packed
    assert packed["position_ids"][0].tolist() == [*range(5), *range(9), *range(3)]
    torch.manual_seed(0)
    config = text_config(position_embedding_type=position_embedding_type, attn_implementation=implementation)
    model = TurnerForCausalLM(config).eval()
    with torch.no_grad():
        logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits
        alone = torch.cat([output.logits[0] for output in each_alone(model, sequences)])
    torch.testing.assert_close(logits[0], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("position_embedding_type", "implementation"), packed_cases(["learned", "rotary"]))
def test_a_packed_row_of_an_encoder_keeps_each_sequence_to_itself(position_embedding_type, implementation):
    """Full attention, packed: a token must not see the other sequences of its row (transformers' bidirectional mask
    reads no positions; Turner finds the sequences in them)."""
    sequences = [random_ids(1, length, seed=seed)[0].tolist() for seed, length in ((1, 5), (2, 9), (3, 3))]
    packed = DataCollatorWithFlattening()([{"input_ids": sequence} for sequence in sequences])
    torch.manual_seed(0)
    config = text_config(is_causal=False, position_embedding_type=position_embedding_type)
    model = TurnerModel._from_config(config, attn_implementation=implementation).eval()
    with torch.no_grad():
        states = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).last_hidden_state
        alone = torch.cat([output.last_hidden_state[0] for output in each_alone(model, sequences)])
    torch.testing.assert_close(states[0], alone, atol=1e-5, rtol=1e-5)
