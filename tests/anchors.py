"""User actions on a causal LM or a sequence classifier, written against transformers' API alone: the same function
runs on an in-library anchor (GPT-2), on a Turner model, and on a Turner folder loaded as remote code in a process
where `turner_tfm` cannot be imported (so this module imports nothing of the repository). Each returns what the user
would look at: logits, tokens, or cached keys."""

import copy
import inspect

import torch
from transformers import DynamicCache, GPT2Model, PreTrainedModel, StaticCache

# The name of the cache in forward arguments and outputs: "cache" from transformers 5.24, "past_key_values" before.
CACHE = "cache" if "cache" in inspect.signature(GPT2Model.forward).parameters else "past_key_values"
FIRST_ID = 3  # ids 0-2 are pad, bos and eos
GREEDY = dict(do_sample=False, max_new_tokens=6, min_new_tokens=6)


def prompts(model: PreTrainedModel, batch: int = 2, length: int = 8, seed: int = 0) -> torch.Tensor:
    """Random ids that are never a special token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_ID, model.config.vocab_size, (batch, length), generator=generator)
    return ids.to(model.device)


def padded(model: PreTrainedModel, side: str) -> dict[str, torch.Tensor]:
    """Two prompts, the second three tokens shorter and padded on `side`."""
    input_ids, attention_mask = prompts(model), torch.ones(2, 8, dtype=torch.long, device=model.device)
    padding = slice(0, 3) if side == "left" else slice(5, 8)
    input_ids[1, padding], attention_mask[1, padding] = model.config.pad_token_id, 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def step(model: PreTrainedModel, input_ids: torch.Tensor, cache=None, **kwargs):
    """One forward pass that makes or extends a cache, as a hand-written decoding loop does."""
    with torch.no_grad():
        return model(input_ids, use_cache=True, **{CACHE: cache}, **kwargs)


# Generation


def cache_arguments(model: PreTrainedModel, kind: str) -> dict:
    """generate() arguments that pick each kind of cache a user picks."""
    return {
        "dynamic": {},
        "static": {"cache_implementation": "static"},
        "offloaded": {"cache_implementation": "offloaded"},
        "user DynamicCache": {CACHE: DynamicCache(config=model.config)},
        "user StaticCache": {CACHE: StaticCache(config=model.config, max_cache_len=16)},
        "no cache": {"use_cache": False},
    }[kind]


def generate_padded(model: PreTrainedModel, cache: str, side: str) -> torch.Tensor:
    return model.generate(**padded(model, side), **cache_arguments(model, cache), **GREEDY)


def generate_seeded(model: PreTrainedModel, **settings) -> torch.Tensor:
    """Sampling or beam search from the same seed: the same tokens when the logits are the same."""
    torch.manual_seed(1234)
    return model.generate(**padded(model, "left"), max_new_tokens=6, **settings)


def generate_scores(model: PreTrainedModel) -> torch.Tensor:
    out = model.generate(**padded(model, "left"), **GREEDY, output_scores=True, return_dict_in_generate=True)
    return torch.stack(out.scores)


def generate_from_embeddings(model: PreTrainedModel) -> torch.Tensor:
    batch = padded(model, "left")
    embeddings = model.get_input_embeddings()(batch.pop("input_ids"))
    return model.generate(inputs_embeds=embeddings, **batch, **GREEDY)


def generate_assisted(model: PreTrainedModel, **settings) -> torch.Tensor:
    """Prompt lookup or an assistant model: candidates are checked, and the cache is cropped back when refused."""
    ids = prompts(model, batch=1, length=10).repeat(1, 2)  # repeats, so that prompt lookup finds candidates
    return model.generate(ids, **GREEDY, **settings)


def generate_from_a_prefix_cache(model: PreTrainedModel) -> torch.Tensor:
    """transformers' prompt-reuse recipe: one cache for the shared prefix, a deep copy of it per continuation."""
    ids = prompts(model, batch=1, length=12)
    prefix = step(model, ids[:, :6])[CACHE]
    runs = [model.generate(ids[:, :end], **{CACHE: copy.deepcopy(prefix)}, **GREEDY) for end in (9, 12)]
    return torch.cat(runs, dim=1)


def prefix_tuned(model: PreTrainedModel):
    """PEFT prefix tuning as its docs show it, four virtual tokens; PEFT's random initial prefix (the same under the
    same seed) is enough to change the logits."""
    from peft import PrefixTuningConfig, get_peft_model

    torch.manual_seed(0)
    return get_peft_model(model, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)).eval()


def prefix_tuned_next_token(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A prompt's next-token logits: of the base model, of the prefix-tuned forward pass, and of the first step of the
    prefix-tuned generate(), with its cache and without."""
    batch = {"input_ids": prompts(model), "attention_mask": torch.ones(2, 8, dtype=torch.long, device=model.device)}
    with torch.no_grad():
        answers = {"base model": model(**batch).logits[:, -1]}
        tuned = prefix_tuned(model)
        answers["forward"] = tuned(**batch).logits[:, -1]
    for use_cache in (True, False):
        out = tuned.generate(
            **batch, max_new_tokens=1, use_cache=use_cache, do_sample=False, return_dict_in_generate=True,
            output_logits=True,
        )  # fmt: skip
        answers[f"generate, use_cache={use_cache}"] = out.logits[0]
    return answers


def prefix_tuned_greedy(model: PreTrainedModel, use_cache: bool) -> torch.Tensor:
    """Sixteen greedy tokens of the prefix-tuned model for a left-padded batch."""
    return prefix_tuned(model).generate(
        **padded(model, "left"), use_cache=use_cache, do_sample=False, max_new_tokens=16, min_new_tokens=16
    )


# The cache by hand: keep, crop, branch, reset, select


def resume_after_crop_and_branch(model: PreTrainedModel) -> torch.Tensor:
    """Keep a cache's tensors (`list(cache)`), crop the cache back to a prefix and continue another branch on it,
    then resume the first branch from the tensors kept."""
    ids, other = prompts(model, batch=1, length=12), prompts(model, batch=1, length=4, seed=1)
    cache = step(model, ids[:, :8])[CACHE]
    kept = list(cache)
    cache.crop(-4)
    step(model, other, cache)
    return step(model, ids[:, 8:12], DynamicCache(ddp_cache_data=kept)).logits


def resume_generate_cache_after_branch(model: PreTrainedModel) -> torch.Tensor:
    """The same, on the cache generate() returns."""
    out = model.generate(prompts(model, batch=1), **GREEDY, return_dict_in_generate=True)
    cache = out[CACHE]
    kept = list(cache)
    cache.crop(-3)
    step(model, prompts(model, batch=1, length=3, seed=1), cache)
    return step(model, out.sequences[:, -1:], DynamicCache(ddp_cache_data=kept)).logits


def resume_after_exploring_a_deep_copy(model: PreTrainedModel) -> torch.Tensor:
    """Crop and continue a deep copy of the cache, then continue the original."""
    ids = prompts(model, batch=1, length=12)
    cache = step(model, ids[:, :8])[CACHE]
    branch = copy.deepcopy(cache)
    branch.crop(-4)
    step(model, prompts(model, batch=1, length=4, seed=1), branch)
    return step(model, ids[:, 8:12], cache).logits


def keys_read_before_a_reset(model: PreTrainedModel) -> torch.Tensor:
    """Keys read from a cache, then the cache reset and reused for another prompt: what the keys read hold now."""
    cache = step(model, prompts(model))[CACHE]
    read = [keys for keys, *_ in cache]
    cache.reset()
    step(model, prompts(model, seed=1), cache)
    return torch.stack(read)


def logits_after_a_reset(model: PreTrainedModel) -> torch.Tensor:
    cache = step(model, prompts(model))[CACHE]
    cache.reset()
    return step(model, prompts(model, seed=1), cache).logits


def continue_after(model: PreTrainedModel, operation: str) -> torch.Tensor:
    """A cache of three rows, shrunk, reordered or repeated as beam search and batch schedulers do, then continued."""
    ids = prompts(model, batch=3, length=10)
    cache = step(model, ids[:, :7])[CACHE]
    if operation == "crop":
        cache.crop(-2)
        return step(model, ids[:, 5:10], cache).logits
    rows = {
        "reorder_cache": (cache.reorder_cache, torch.tensor([2, 0, 1])),
        "batch_select_indices": (cache.batch_select_indices, torch.tensor([0, 2])),
        "batch_repeat_interleave": (cache.batch_repeat_interleave, 2),
    }
    apply, argument = rows[operation]
    apply(argument)
    rows_now = torch.arange(3).repeat_interleave(2) if operation == "batch_repeat_interleave" else argument
    return step(model, ids[rows_now, 7:], cache).logits


def decode_by_hand(model: PreTrainedModel) -> torch.Tensor:
    """A left-padded batch decoded token by token with a growing mask: the loop generate() runs, written out."""
    batch = padded(model, "left")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out = step(model, ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    logits = [out.logits[:, -1]]
    for _ in range(4):
        mask = torch.cat([mask, mask.new_ones(2, 1)], dim=1)
        out = step(
            model,
            logits[-1].argmax(-1, keepdim=True),
            out[CACHE],
            attention_mask=mask,
            position_ids=mask.sum(-1, keepdim=True) - 1,
        )
        logits.append(out.logits[:, -1])
    return torch.stack(logits, dim=1)


# What issue 35 found (items 2, 6, 7, 8)


def continue_a_cache_made_in_train_mode(model: PreTrainedModel) -> torch.Tensor:
    """`model.train(); out = model(x[:, :5], use_cache=True)`, then decoding on from `out`'s cache."""
    ids = prompts(model, batch=1, length=8)
    model.train()
    out = model(ids[:, :5], use_cache=True)
    model.eval()
    return step(model, ids[:, 5:], out[CACHE]).logits


def forward_with_cache_position(model: PreTrainedModel) -> torch.Tensor:
    """An older decoding loop that passes `cache_position` (the positions the model derives itself)."""
    ids = prompts(model, batch=1, length=8)
    out = step(model, ids[:, :5], cache_position=torch.arange(5))
    return step(model, ids[:, 5:], out[CACHE], cache_position=torch.arange(5, 8)).logits


def eos_inside_the_text(model: PreTrainedModel) -> torch.Tensor:
    """`pad_token_id == eos_token_id` (GPT-2's usual setup), an eos separating two sentences, no attention mask."""
    ids = prompts(model, length=9)
    ids[:, 4] = model.config.eos_token_id
    with torch.no_grad():
        return model(ids).logits


def packed_row(model: PreTrainedModel, training: bool) -> torch.Tensor:
    """Two sequences in one row, positions restarting at the second, no mask (`DataCollatorWithFlattening`)."""
    first, second = prompts(model, batch=1, length=5), prompts(model, batch=1, length=4, seed=1)
    positions = torch.cat([torch.arange(5), torch.arange(4)]).unsqueeze(0)
    model.train(training)
    with torch.no_grad():
        return model(torch.cat([first, second], dim=1), position_ids=positions).logits


def each_sequence_alone(model: PreTrainedModel) -> torch.Tensor:
    """What `packed_row` must answer: each sequence run on its own."""
    with torch.no_grad():
        alone = [model(prompts(model, batch=1, length=5)).logits, model(prompts(model, 1, 4, seed=1)).logits]
    return torch.cat(alone, dim=1)


def classify_with_a_4d_mask(model: PreTrainedModel) -> torch.Tensor:
    """A right-padded batch with its mask given as 4-D floats (0 to attend, the dtype's minimum not to), causal."""
    batch = padded(model, "right")
    allowed = batch["attention_mask"][:, None, None, :].bool() & torch.ones(8, 8, dtype=torch.bool).tril()
    minimum = torch.finfo(model.dtype).min
    mask = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, minimum)
    with torch.no_grad():
        return model(batch["input_ids"], attention_mask=mask).logits


def classify_padded(model: PreTrainedModel, side: str, with_mask: bool) -> torch.Tensor:
    batch = padded(model, side)
    if not with_mask:
        del batch["attention_mask"]
    with torch.no_grad():
        return model(**batch).logits
