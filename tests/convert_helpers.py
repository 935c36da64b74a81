"""What the converter tests share: equality checks, a tiny local tokenizer, and a runner for the command line."""

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parent.parent
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "big", "small", "red", "blue"]
TOLERANCE = 1e-5


def word_tokenizer(specials: Mapping[str, str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `WORDS`; `specials` maps a role ("pad_token", ...) to its token, ids 0, 1, ..."""
    vocab = {token: index for index, token in enumerate(specials.values())}
    vocab.update({word: len(vocab) + index for index, word in enumerate(WORDS)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token=specials["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


def assert_same_outputs(
    source: PreTrainedModel, turner: PreTrainedModel, inputs: Mapping[str, torch.Tensor], names: tuple[str, ...]
) -> None:
    """The two models' outputs `names` agree to TOLERANCE on `inputs` (fp32, eval mode)."""
    source.eval()
    turner.eval()
    with torch.no_grad():
        expected, actual = source(**inputs), turner(**inputs)
    for name in names:
        assert expected[name].shape == actual[name].shape, name
        torch.testing.assert_close(actual[name], expected[name], atol=TOLERANCE, rtol=TOLERANCE, msg=name)


def assert_same_state_dict(expected: PreTrainedModel, actual: PreTrainedModel) -> None:
    """Same keys and bit-identical tensors."""
    expected_tensors, actual_tensors = expected.state_dict(), actual.state_dict()
    assert sorted(actual_tensors) == sorted(expected_tensors)
    different = [key for key in expected_tensors if not torch.equal(expected_tensors[key], actual_tensors[key])]
    assert not different, f"tensors differ after the round trip: {different}"


def masked_ids(vocab_size: int, pad_token_id: int, lengths: tuple[int, ...], seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch: random real tokens (never the pad id), then padding, and its attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.randint(pad_token_id + 1, vocab_size, (len(lengths), width), generator=generator)
    attention_mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
    input_ids[attention_mask == 0] = pad_token_id
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def run_convert(*args: str) -> subprocess.Popen:
    """Start `python -m convert ARGS` from the repository root (offline); the caller waits on it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, "-m", "convert", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
