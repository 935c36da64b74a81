"""Load: long cached generation and many pipeline calls hold memory flat (resident set size, read from /proc)."""

import gc
import string
import sys

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, StaticCache, pipeline

from turner_tfm import TurnerForCausalLM

from .tiny import text_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

MIB = 2**20


def resident_bytes() -> int:
    gc.collect()
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def growth_after_warmup(samples: list[int]) -> int:
    """Largest rise of the resident set over the samples after the first (warm-up) one."""
    return max(samples[1:]) - samples[1]


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    vocab.update({char: i + 4 for i, char in enumerate(string.ascii_lowercase + " .,")})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]"
    )


@pytest.mark.parametrize("total_tokens", [800, pytest.param(4000, marks=pytest.mark.slow)])
def test_long_generation_in_chunks_with_the_static_cache_holds_memory_flat(total_tokens):
    config = text_config(position_embedding_type="sinusoidal", max_position_embeddings=total_tokens)
    model = TurnerForCausalLM(config).eval()
    cache = StaticCache(config=config, max_cache_len=total_tokens)
    token = torch.tensor([[5]])
    samples = []
    with torch.no_grad():
        model(torch.randint(3, 99, (1, 96)), cache=cache, use_cache=True)  # a prompt, then decode
        for step in range(total_tokens - 96):
            logits = model(token, cache=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)
            if step % (total_tokens // 8) == 0:
                samples.append(resident_bytes())
    assert cache.get_seq_length() == total_tokens
    assert torch.isfinite(logits).all()
    assert growth_after_warmup(samples) < 16 * MIB, [s // MIB for s in samples]


@pytest.mark.parametrize("calls", [200, pytest.param(3000, marks=pytest.mark.slow)])
def test_thousands_of_pipeline_calls_hold_memory_flat(calls):
    tokenizer = char_tokenizer()
    config = text_config(vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=1, eos_token_id=2)
    generator = pipeline("text-generation", model=TurnerForCausalLM(config).eval(), tokenizer=tokenizer)
    samples = []
    for call in range(calls):
        result = generator("to be or not", max_new_tokens=3, do_sample=False)
        if call % (calls // 8) == 0:
            samples.append(resident_bytes())
    assert result[0]["generated_text"].startswith("to be or not")
    assert growth_after_warmup(samples) < 16 * MIB, [s // MIB for s in samples]
