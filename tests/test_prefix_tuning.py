"""PEFT prefix tuning with generate()'s cache (issue 50 item 2): the prefix is read at every step, never dropped.

PEFT hands its prefix to the model as a cache already holding the virtual tokens, under `past_key_values`; from
transformers 5.24, generate() passes its own cache beside it as `cache`, and transformers' models (GPT-2 among them)
read `cache` and drop the prefix, with a FutureWarning. Turner reads both (`compat_turner.one_cache`): the first
generated step's logits are the prefix-tuned forward pass's, and cached greedy decoding gives the uncached tokens,
for learned and rotary positions, installed and as remote code. The learned-position model is GPT-2 converted, so its
prefix-tuned forward pass is GPT-2's (the yardstick, side by side); what GPT-2's own cached generate() does is not
asserted: it follows transformers' handling, which may change.
"""

import json
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from convert import gpt2
from turner_tfm import TurnerForCausalLM

from . import anchors
from .isolated import run_isolated
from .tiny import text_config

TOLERANCE = 1e-4
POSITIONS = ["learned", "rotary"]


def gpt2_anchor() -> GPT2LMHeadModel:
    sizes = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, initializer_range=0.3)
    specials = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = GPT2Config(**sizes, **specials, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def turner(positions: str) -> TurnerForCausalLM:
    """Learned positions: GPT-2 converted, number for number; rotary: a tiny Turner model."""
    if positions == "learned":
        return gpt2.CONVERTER.model_to_turner(gpt2_anchor()).eval()
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(position_embedding_type=positions, initializer_range=0.3)).eval()


def assert_the_prefix_is_read(answers: dict[str, torch.Tensor]) -> None:
    """The prefix changes the next-token logits, and generate()'s first step gives the prefix-tuned forward's, with
    its cache and without."""
    assert (answers["forward"] - answers["base model"]).abs().max() > 1e-2, "the prefix should change the logits"
    for use_cache in (True, False):
        generated = answers[f"generate, use_cache={use_cache}"]
        torch.testing.assert_close(generated, answers["forward"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_generate_reads_the_prefix_as_the_prefix_tuned_forward_does(positions):
    assert_the_prefix_is_read(anchors.prefix_tuned_next_token(turner(positions)))


@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_greedy_decoding_gives_the_uncached_tokens(positions):
    model = turner(positions)
    cached = anchors.prefix_tuned_greedy(model, use_cache=True)
    assert cached.shape == (2, 8 + 16)
    assert torch.equal(cached, anchors.prefix_tuned_greedy(model, use_cache=False))


def test_the_prefix_tuned_turner_model_answers_as_the_prefix_tuned_gpt2_forward():
    """Side by side with the anchor: the same prefix (the same seed, the same shapes) on GPT-2 and on GPT-2 converted;
    GPT-2's forward pass and its uncached first step are the yardstick Turner's cached first step meets."""
    expected = anchors.prefix_tuned_next_token(gpt2_anchor())
    torch.testing.assert_close(expected["generate, use_cache=False"], expected["forward"], atol=TOLERANCE, rtol=0)
    answers = anchors.prefix_tuned_next_token(turner("learned"))
    for name in ("base model", "forward", "generate, use_cache=True"):
        torch.testing.assert_close(answers[name], expected[name if "generate" not in name else "forward"])


# The same actions on saved folders loaded as remote code, where `turner_tfm` cannot be imported (peft can).
REMOTE_ACTIONS = textwrap.dedent(
    """
    import importlib.util, json, sys
    sys.modules["turner_tfm"] = None
    import torch, transformers
    spec = importlib.util.spec_from_file_location("anchors", sys.argv[2])  # tests/anchors.py, by its path
    anchors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchors)
    for folder, outputs_file in json.loads(sys.argv[1]):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        answers = anchors.prefix_tuned_next_token(model)
        for use_cache in (True, False):
            answers[f"greedy, use_cache={use_cache}"] = anchors.prefix_tuned_greedy(model, use_cache=use_cache)
        torch.save(answers, outputs_file)
    """
)


@pytest.fixture(scope="module")
def remote_answers(tmp_path_factory) -> dict[str, tuple[PreTrainedModel, dict]]:
    """For each kind of positions: the installed model, and what its saved folder answered as remote code."""
    root = tmp_path_factory.mktemp("prefix")
    models, jobs = {}, []
    for positions in POSITIONS:
        models[positions] = turner(positions)
        models[positions].save_pretrained(root / positions)
        jobs.append([str(root / positions), str(root / f"{positions}.pt")])
    run_isolated(REMOTE_ACTIONS, [json.dumps(jobs), str(Path(__file__).with_name("anchors.py"))], root)
    return {positions: (models[positions], torch.load(job[1])) for positions, job in zip(POSITIONS, jobs, strict=True)}


@pytest.mark.parametrize("positions", POSITIONS)
def test_a_folder_loaded_as_remote_code_reads_the_prefix(positions, remote_answers):
    installed, remote = remote_answers[positions]
    assert_the_prefix_is_read(remote)
    assert torch.equal(remote["greedy, use_cache=True"], remote["greedy, use_cache=False"])
    torch.testing.assert_close(remote["forward"], anchors.prefix_tuned_next_token(installed)["forward"])
