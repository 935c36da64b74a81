"""Where the value checks run and what they read (issue 43), on the CPU: a user's call reads its token ids, labels and
positions back once, together; generate() reads its prompt once and none of the tokens the model chose itself; nothing
is read while torch.compile traces, and `config.check_input_values=False` reads nothing at all. `tests/test_cuda.py`
runs the same cases on a GPU, where a read is a device sync and an unchecked bad id a device-side assert."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import StoppingCriteria, Trainer, TrainingArguments

import turner_tfm.checks_turner as checks
import turner_tfm.modeling_turner as modeling
from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification
from turner_tfm.compat_turner import output_cache

from .tiny import random_ids, text_config


@pytest.fixture()
def reads(monkeypatch) -> list[list[str]]:
    """Each host read of the value checks: the names of the tensors it read, in one list per read."""
    recorded, read = [], checks.raise_if_out_of_range

    def recording(checks):
        names = [check.name for check in checks if check is not None]
        if names:
            recorded.append(names)
        return read(checks)

    for module in (checks, modeling):
        monkeypatch.setattr(module, "raise_if_out_of_range", recording)
    return recorded


def other_reads(call) -> int:
    """Reads of a single value (`item`) that `call` makes besides the checks' own (a read is a sync on a GPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return sum(event.count for event in profile.key_averages() if event.key == "aten::_local_scalar_dense")


def causal_lm(**overrides) -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(**overrides)).eval()


def test_a_training_forward_reads_its_ids_and_labels_once_together(reads):
    model = causal_lm().train()
    ids = random_ids(2, 6)
    assert other_reads(lambda: model(ids, labels=ids).loss.backward()) == 0
    assert reads == [["input_ids", "labels"]]


def test_the_positions_a_caller_passes_are_read_with_the_ids(reads):
    model = causal_lm()
    with torch.no_grad():
        model(random_ids(1, 4), position_ids=torch.arange(4).unsqueeze(0), attention_mask=torch.ones(1, 4))
    assert reads == [["input_ids", "position_ids"]]


def test_a_classifier_reads_its_ids_and_labels_once_together(reads):
    torch.manual_seed(0)
    model = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3))
    model(random_ids(2, 5), labels=torch.tensor([0, 2]))
    assert reads == [["input_ids", "labels"]]
    with pytest.raises(
        ValueError,
        match=r"^`labels` has 3 at row 1; class ids must be in \[0, 3\) \(num_labels\), or -100 \(ignored\)\.$",
    ):
        model(random_ids(2, 5), labels=torch.tensor([0, 3]))


@pytest.mark.parametrize("new_tokens", [2, 12])
def test_generate_reads_its_prompt_once_and_never_the_tokens_it_chose(reads, new_tokens):
    model = causal_lm()
    model.generate(random_ids(2, 5), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    assert len(reads) == 1 and reads[0][0] == "input_ids", reads


@pytest.mark.parametrize("num_beams", [1, 3])
def test_every_decoding_step_after_the_prompt_skips_the_checks(monkeypatch, num_beams):
    """The forward passes generate() makes, seen from inside: the prompt's is checked, every later one is not."""
    model, checked, forwards = causal_lm(), [], []
    monkeypatch.setattr(checks, "check_call", lambda *args, **kwargs: checked.append(True))
    model.register_forward_pre_hook(lambda module, args: forwards.append(True))
    model.generate(random_ids(1, 5), max_new_tokens=6, min_new_tokens=6, num_beams=num_beams, do_sample=False)
    assert (len(forwards), len(checked)) == (6, 1)


def test_a_users_own_decoding_loop_is_checked_at_every_step(reads):
    model = causal_lm()
    with torch.no_grad():
        cache = output_cache(model(random_ids(1, 4), use_cache=True))
        for _ in range(3):
            model(random_ids(1, 1), cache=cache, use_cache=True)
        with pytest.raises(ValueError, match=r"`input_ids` has 99 at row 0, position 0;"):
            model(torch.tensor([[99]]), cache=cache)
    assert len(reads) == 5


def test_assisted_decoding_checks_the_candidates_it_is_fed(reads):
    """Another model's candidates are not the model's own tokens: each round of assisted decoding is checked."""
    model, assistant = causal_lm(), causal_lm(num_hidden_layers=1)
    model.generate(random_ids(1, 5), assistant_model=assistant, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert len(reads) > 2


def test_the_switch_turns_every_read_off(reads):
    """`check_input_values=False`: nothing is read back, and a bad id meets torch's own error instead of ours (on a
    GPU, a device-side assert)."""
    model = causal_lm(check_input_values=False)
    ids = random_ids(2, 6)
    model(ids, labels=ids)
    assert reads == []
    with pytest.raises(IndexError):
        model(torch.tensor([[5, 99]]))


def test_nothing_is_read_while_torch_compile_traces():
    """A read inside a compiled region would break the graph; `fullgraph=True` refuses any break."""
    model = causal_lm().train()
    ids = random_ids(2, 6)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    loss = compiled(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, model(input_ids=ids, labels=ids).loss)


def test_a_prompt_that_outgrows_the_learned_positions_is_refused_before_any_step(reads):
    """Issue 44 item 3: the prompt's length and the new tokens, against max_position_embeddings, with the ways out."""
    model, forwards = causal_lm(), []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    with pytest.raises(ValueError) as error:
        model.generate(random_ids(1, 50), max_new_tokens=20, do_sample=False)
    message = str(error.value)
    assert "20 new tokens after a prompt of 50 tokens" in message and "max_position_embeddings=64" in message
    assert "at most 15 new tokens (max_new_tokens)" in message and "truncate" in message and "rotary" in message
    with pytest.raises(ValueError, match="a prompt of 100 tokens"):
        model.generate(random_ids(1, 100), max_new_tokens=4)
    assert forwards == []
    assert model.generate(random_ids(1, 50), max_new_tokens=15, min_new_tokens=15).shape == (1, 65)


def test_a_pad_id_outside_the_vocabulary_is_refused_where_generate_would_feed_it_back():
    model = causal_lm(pad_token_id=63)
    model.resize_token_embeddings(10)
    settings = dict(max_new_tokens=3, do_sample=False, eos_token_id=5)
    assert model.generate(random_ids(1, 4, vocab_size=10), **settings).shape[0] == 1  # one row: no row is padded
    with pytest.raises(ValueError, match=r"`pad_token_id` 63 is invalid: generate\(\) feeds it to the model"):
        model.generate(random_ids(2, 4, vocab_size=10), **settings)
    with pytest.raises(
        ValueError, match=r"`pad_token_id` 63 is invalid: .*\(the end-of-sequence id 5 can be generated\)"
    ):
        model.generate(random_ids(1, 4, vocab_size=10), num_return_sequences=2, **settings | dict(do_sample=True))


def test_a_pad_id_that_no_row_can_feed_back_is_not_refused():
    """Issue 50, item 1: with an end-of-sequence id outside the vocabulary no row ends early, so the pad id is never
    fed back and may be anything (transformers' GenerationTesterMixin sets both to -1 so that no row stops)."""
    model, ids = causal_lm(), random_ids(2, 4)
    expected = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    for pad in (-1, 99, None):  # None: generate() pads with the first eos id, -1 again
        generated = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=pad)
        assert torch.equal(generated, expected)
    assert expected.shape == (2, 10)  # every row ran to max_new_tokens
    sampled = model.generate(
        random_ids(1, 4), max_new_tokens=6, do_sample=True, num_return_sequences=3, eos_token_id=-1, pad_token_id=-1
    )
    assert sampled.shape == (3, 10)


class EndsTheFirstRow(StoppingCriteria):
    """A caller's criterion that ends row 0 at once and leaves the others running."""

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return torch.arange(input_ids.shape[0]) == 0


def test_a_pad_id_that_a_callers_stopping_criterion_would_feed_back_is_refused():
    """A caller's criterion may end any row: the pad id would be fed back, unchecked (the steps after the prompt are the
    model's own tokens), so an id outside the vocabulary is refused by name even with an eos id that cannot end one."""
    model, ids = causal_lm(), random_ids(2, 4)
    settings = dict(max_new_tokens=4, do_sample=False, eos_token_id=-1, stopping_criteria=[EndsTheFirstRow()])
    with pytest.raises(ValueError, match=r"`pad_token_id` 99 is invalid: .* \(EndsTheFirstRow may end one\)"):
        model.generate(ids, pad_token_id=99, **settings)
    generated = model.generate(ids, pad_token_id=0, **settings)
    assert generated[0, 5:].tolist() == [0, 0, 0] and 0 not in generated[1, 4:].tolist()  # row 0 padded after 1 step


def test_the_switch_turns_the_pad_id_refusal_off():
    """`check_input_values=False` turns this value check off as every other: a row that ends feeds the pad id to the
    embedding, which fails in torch as GPT-2 does (tests/test_like_in_library.py has GPT-2's side)."""
    model = causal_lm(pad_token_id=63, check_input_values=False)
    model.resize_token_embeddings(10)
    ids = random_ids(2, 4, vocab_size=10)
    first = model.generate(ids, max_new_tokens=1, do_sample=False)[:, -1]
    never_chosen = next(token for token in range(3, 10) if token not in first.tolist())
    assert model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=never_chosen).shape == (2, 5)
    with pytest.raises(IndexError):
        model.generate(ids, max_new_tokens=3, do_sample=False, eos_token_id=int(first[0]))


def train_on_a_bad_batch(tmp_path: Path, device: str) -> None:
    """A Trainer meets a batch with an id outside the vocabulary after its first checkpoint: it stops with the
    error naming the argument and the row, and the checkpoint on disk loads and resumes (nothing lost)."""
    ids = random_ids(8, 6)
    ids[5, 3] = 99  # in the third batch of two rows (its row 1), after the checkpoint of step 2
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=4,
        save_steps=2,
        report_to="none",
        use_cpu=device == "cpu",
        train_sampling_strategy="sequential",
    )
    torch.manual_seed(0)
    trainer = Trainer(model=TurnerForCausalLM(text_config()), args=args, train_dataset=data)
    with pytest.raises(ValueError, match=r"`input_ids` has 99 at row 1, position 3; token ids"):
        trainer.train()
    checkpoint = tmp_path / "checkpoint-2"
    saved = TurnerForCausalLM.from_pretrained(checkpoint).to(device)
    for name, tensor in saved.state_dict().items():
        assert torch.isfinite(tensor).all(), name
    good = torch.cat([ids[:4], ids[6:]])
    data = Dataset.from_dict({"input_ids": good.tolist(), "labels": good.tolist()})
    resumed = Trainer(model=TurnerForCausalLM(text_config()), args=args, train_dataset=data)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4


def test_a_trainer_meeting_a_bad_batch_stops_by_name_and_keeps_its_checkpoint(tmp_path):
    train_on_a_bad_batch(tmp_path, "cpu")
