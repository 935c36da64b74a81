"""Train a Turner extractive question-answering model (BERT's SQuAD head: the answer is a span of the context) and
report its exact match and F1 on held-out questions.

Data: JSON lines of `question`, `context`, `answer` (the answer's text, found in the context), or by default a task
made here from the standard library: a context that lists calls of a few of its functions at random line numbers
("line 212 calls dumps.") and a question about one ("Which line calls dumps?"). The script trains
`TurnerForQuestionAnswering` with the `Trainer`, reads each answer as the best span of its context (transformers 5 has
no question-answering pipeline; this is how its run_qa.py reads one), and saves model, code, tokenizer and card.

    python -m examples.train_question_answering
    python -m examples.train_question_answering --train_file qa.jsonl

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`). Run from the
repository root.
"""

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from datasets import Dataset, load_dataset
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

from examples.helpers import callbacks, data, distributed, model_card, training
from turner_tfm import TurnerForQuestionAnswering


@dataclass
class ScriptModelArguments:
    tokenizer: Literal["bpe", "char"] = field(default="bpe", metadata={"help": "trained here on the questions"})
    vocab_size: int = field(default=2000, metadata={"help": "tokens of the BPE tokenizer"})


ModelArguments = training.config_arguments(
    ScriptModelArguments,
    exclude=("tie_word_embeddings", *training.CLASSIFIER_FIELDS),
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    position_embedding_type="rotary",  # 2 blocks of D=64, learned positions: at chance after 5 epochs (workflows.md)
)


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "JSON lines of question, context and answer"})
    questions: int = field(default=20000, metadata={"help": "size of the built-in which-line task"})
    calls_per_context: int = field(default=2, metadata={"help": "calls each built-in context lists"})
    test_split_percentage: float = field(default=10.0, metadata={"help": "share held out for the scores"})
    max_length: int = field(default=192, metadata={"help": "tokens of question and context; longer is cut"})
    max_answer_tokens: int = field(default=30, metadata={"help": "the longest span read as an answer"})

    def __post_init__(self) -> None:
        training.check_file("train_file", self.train_file, (".json", ".jsonl"))


def read_questions(path: str) -> list[tuple[str, str, str, int]]:
    """(question, context, answer, where it starts) of each row of `path`; an answer not in its context is refused."""
    table = load_dataset("json", data_files=path, split="train")
    missing = sorted({"question", "context", "answer"} - set(table.column_names))
    if missing:
        raise training.UsageError(f"{path!r} lacks the columns {missing}: it has {table.column_names}")
    rows = [(row["question"], row["context"], row["answer"], row["context"].find(row["answer"])) for row in table]
    for number, (_, _, answer, start) in enumerate(rows, 1):
        if start < 0:
            raise training.UsageError(f"{path!r}, row {number}: the answer {answer!r} is not in its context")
    return rows


def best_span(start_logits, end_logits, sequence_ids, offsets, context: str, max_tokens: int) -> str:
    """The context's span with the highest start + end score, at most `max_tokens` tokens long."""
    in_context = np.array([sequence == 1 for sequence in sequence_ids[: len(start_logits)]])
    starts = np.where(in_context, start_logits[: len(in_context)], -np.inf)
    ends = np.where(in_context, end_logits[: len(in_context)], -np.inf)
    positions = np.arange(len(starts))
    spans = (positions[None, :] >= positions[:, None]) & (positions[None, :] < positions[:, None] + max_tokens)
    start, end = divmod(int(np.argmax(np.where(spans, starts[:, None] + ends[None, :], -np.inf))), len(starts))
    return context[offsets[start][0] : offsets[end][1]].strip()  # a BPE token carries the space before it


def f1(prediction: str, answer: str) -> float:
    """SQuAD's F1: the words the two share, as a harmonic mean of precision and recall."""
    shared = sum((collections.Counter(prediction.split()) & collections.Counter(answer.split())).values())
    return 0.0 if shared == 0 else 2 * shared / (len(prediction.split()) + len(answer.split()))


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-question-answering", num_train_epochs=1, learning_rate=1e-3,
    )  # fmt: skip
    if data_args.train_file is None:
        rows = data.which_line(data_args.questions, data_args.calls_per_context, training_args.seed)
        dataset_name = "stdlib which-line-calls"
    else:
        rows, dataset_name = read_questions(data_args.train_file), Path(data_args.train_file).stem
    text = "\n".join(f"{question}\n{context}" for question, context, *_ in rows)
    tokenizer = data.text_tokenizer(model_args.tokenizer, text, model_args.vocab_size, data_args.max_length)

    def tokenize(batch: dict) -> dict:  # the answer's first and last tokens (0, 0 where the context was cut before it)
        encoded = tokenizer(batch["question"], batch["context"], truncation="only_second", return_offsets_mapping=True)
        encoded["start_positions"], encoded["end_positions"], encoded["sequence_ids"] = [], [], []
        for i, offsets in enumerate(encoded["offset_mapping"]):
            sequence_ids, start = encoded.sequence_ids(i), batch["start"][i]
            end = start + len(batch["answer"][i])
            tokens = [t for t, (s, e) in enumerate(offsets) if sequence_ids[t] == 1 and s < end and e > start]
            encoded["start_positions"].append(tokens[0] if tokens else 0)
            encoded["end_positions"].append(tokens[-1] if tokens else 0)
            encoded["sequence_ids"].append([-1 if s is None else s for s in sequence_ids])
        return encoded

    columns = ("question", "context", "answer", "start")
    questions = Dataset.from_dict({name: [row[i] for row in rows] for i, name in enumerate(columns)})
    parts = questions.map(tokenize, batched=True).train_test_split(data_args.test_split_percentage / 100, seed=0)
    # the start of an answer is known from both sides
    config = training.text_config(tokenizer, data_args.max_length, model_args, is_causal=False)
    model = TurnerForQuestionAnswering(config)
    distributed.announce(
        f"data: {dataset_name}, {len(parts['train'])} training and {len(parts['test'])} test questions; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    model_inputs = ["input_ids", "attention_mask", "start_positions", "end_positions"]
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=parts["train"].select_columns(model_inputs),
        eval_dataset=parts["test"].select_columns(model_inputs),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    training.train(trainer)

    start_logits, end_logits = trainer.predict(parts["test"].select_columns(model_inputs)).predictions
    test = parts["test"]
    answers = [
        best_span(*logits, row["sequence_ids"], row["offset_mapping"], row["context"], data_args.max_answer_tokens)
        for *logits, row in zip(start_logits, end_logits, test, strict=True)
    ]
    truths = [row["answer"].strip() for row in test]
    results = {
        "exact_match": float(np.mean([a.strip() == truth for a, truth in zip(answers, truths, strict=True)])),
        "f1": float(np.mean([f1(a, truth) for a, truth in zip(answers, truths, strict=True)])),
    }
    distributed.announce(
        f"held-out exact match {results['exact_match']:.4f}, F1 {results['f1']:.4f} on {len(test)} questions\n\n"
        f"question: {test[0]['question']!r}\ncontext: {test[0]['context']!r}\nanswer: {answers[0]!r}\n"
    )

    model_card.save_with_card(
        trainer,
        task="question-answering",
        results=results,
        dataset_name=dataset_name,
        example_input=test[0]["question"],
        example_context=test[0]["context"],
    )


if __name__ == "__main__":
    training.run(main)
