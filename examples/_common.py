"""What the example scripts share once their arguments are checked: the built-in corpora (text that ships with Python),
tokenizers trained on the spot, datasets, `TrainingArguments` from the common flags, and saving a model with its
tokenizer or image processor and a filled model card.
"""

import argparse
import ast
import contextlib
import datetime
import importlib
import inspect
import math
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from _cli import MODEL_FLAGS, PROCESSES_KEY, TRAINING_FLAGS, UsageError
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DistributedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    pipeline,
    set_seed,
)
from transformers.trainer_callback import ExportableState

from turner_tfm import TurnerConfig
from turner_tfm.cards import write_model_card

# Pure-Python standard-library modules whose docstrings and code make the default corpora: present in every
# CPython install (3.10+), readable English and Python, about half a megabyte of docstrings.
STDLIB_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "collections", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest", "email.message", "enum",
    "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob", "graphlib", "gzip", "heapq", "html.parser",
    "http.client", "http.cookiejar", "inspect", "ipaddress", "itertools", "json", "locale", "logging", "mailbox",
    "netrc", "numbers", "operator", "optparse", "pathlib", "pickle", "plistlib", "pprint", "pydoc", "queue", "random",
    "re", "sched", "selectors", "shlex", "shutil", "smtplib", "statistics", "string", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "types", "typing", "unittest.case",
    "urllib.parse", "warnings", "wave", "weakref", "xml.dom.minidom", "zipfile",
)  # fmt: skip
STDLIB_DOCS_NAME = "Python standard-library docstrings"
STDLIB_DOCS_ID = "python-stdlib-docstrings"
STDLIB_CODE_NAME = "Python standard-library source code (docstrings removed)"
STDLIB_CODE_ID = "python-stdlib-code"
SPECIAL_TOKENS = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "<eos>"}


def _stdlib_modules() -> list:
    return [importlib.import_module(name) for name in STDLIB_MODULES]


def stdlib_docstrings() -> str:
    """The default text corpus: every public docstring of `STDLIB_MODULES`, once each, in a fixed order."""
    return "\n\n".join(_stdlib_docstring_list())


def _stdlib_docstring_list() -> list[str]:
    seen: set[str] = set()
    docs: list[str] = []

    def add(obj: object) -> None:
        doc = inspect.getdoc(obj)
        if doc and len(doc) > 40 and doc not in seen:
            seen.add(doc)
            docs.append(doc)

    for module in _stdlib_modules():
        add(module)
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            add(obj)
            if inspect.isclass(obj):
                for method_name, method in sorted(vars(obj).items()):
                    if not method_name.startswith("_"):
                        add(method)
    return docs


def stdlib_code() -> str:
    """The source of `STDLIB_MODULES` with docstrings and comments removed: Python code only."""
    sources = []
    for module in _stdlib_modules():
        if not str(getattr(module, "__file__", "")).endswith(".py"):
            continue  # built into the interpreter: no source
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and _is_docstring(body[0]):
                node.body = body[1:] or [ast.Pass()]
        sources.append(ast.unparse(tree))
    return "\n\n".join(sources)


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def code_or_prose(examples_per_class: int, seed: int) -> tuple[list[str], list[str]]:
    """The default text-classification task: is a line Python code or English prose? Prose lines are the first lines
    of stdlib docstrings, code lines come from the same modules' code. Returns (texts, labels), shuffled."""
    summaries = {doc.split("\n", 1)[0] for doc in _stdlib_docstring_list()}
    prose = sorted(line for line in summaries if line[:1].isupper() and line.endswith(".") and " " in line)
    code = sorted({line.strip() for line in stdlib_code().splitlines()})
    rng = random.Random(seed)
    rows = []
    for label, lines in (("prose", prose), ("code", code)):
        lines = [line for line in lines if 20 <= len(line) <= 100]
        rows += [(text, label) for text in rng.sample(lines, min(examples_per_class, len(lines)))]
    rng.shuffle(rows)
    return [text for text, _ in rows], [label for _, label in rows]


def split_text(text: str, validation_percentage: float) -> tuple[str, str]:
    """Hold out the last `validation_percentage` % of `text` (cut at a line break) for evaluation."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - validation_percentage / 100)))
    cut = cut if cut > 0 else int(len(text) * (1 - validation_percentage / 100))
    return text[:cut], text[cut:]


def char_tokenizer(texts: Iterable[str], model_max_length: int) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character seen in `texts`, plus <pad>, <unk> and <eos>.

    Built with the `tokenizers` library (a word-level model over single characters), so it is a real
    `PreTrainedTokenizerFast`: it saves to tokenizer.json and loads back with `AutoTokenizer`.
    """
    chars = sorted(set().union(*(set(text) for text in texts)))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS.values(), *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return _wrap(backend, model_max_length)


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with `vocab_size` tokens, trained on `texts` here (GPT-2's scheme, no download)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return _wrap(backend, model_max_length)


def _wrap(backend: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )


def token_blocks(tokenizer: PreTrainedTokenizerFast, text: str, block_size: int, what: str) -> Dataset:
    """`text` as consecutive blocks of `block_size` tokens (the remainder is dropped), labels = inputs."""
    ids = [
        i for encoding in tokenizer.backend_tokenizer.encode_batch(text.splitlines(keepends=True)) for i in encoding.ids
    ]
    count = len(ids) // block_size
    if count == 0:
        raise UsageError(
            f"argument --block-size: {block_size} is not valid: the {what} text has only {len(ids)} tokens; "
            "use a smaller --block-size or more text"
        )
    blocks = [ids[i * block_size : (i + 1) * block_size] for i in range(count)]
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


def turner_config(args: argparse.Namespace, **fields: object) -> TurnerConfig:
    """`TurnerConfig` from the flags of `_cli.add_model_arguments` (those left unset keep the config's defaults) and
    the `fields` the script derives from its data; a bad combination of flags is reported like a bad flag."""
    flags = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name, None) is not None}
    try:
        return TurnerConfig(**fields, **flags)
    except ValueError as error:
        raise UsageError(f"the model flags make no valid model: {error}") from None


def training_arguments(
    args: argparse.Namespace, arguments_class: type[TrainingArguments] = TrainingArguments, **overrides: object
) -> TrainingArguments:
    """`TrainingArguments` (or the subclass `arguments_class`, e.g. sentence-transformers') from the flags of
    `_cli.add_training_arguments` (each passed as it is); `overrides` win."""
    start_process_group(args)
    kwargs = {name: getattr(args, name) for name in TRAINING_FLAGS}
    kwargs.update(
        logging_first_step=True,
        eval_strategy="steps" if args.eval_steps else "no",
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=args.use_cpu or distributed_without_gpu(),
        ddp_find_unused_parameters=False,  # every parameter takes part in every forward pass
    )
    kwargs.update(overrides)
    try:
        return arguments_class(**kwargs)
    except ValueError as error:  # a combination TrainingArguments refuses, e.g. --bf16 where no bf16 is
        raise UsageError(f"the training flags do not go together: {error}") from None


class UnmarkCheckpointBeforeSaving(TrainerCallback):
    """Before the Trainer saves checkpoint-N into a folder an earlier run left (a run resumed from an older
    checkpoint), delete that folder's trainer_state.json, and each process its own RNG state: the Trainer writes
    trainer_state.json last, so the folder counts as complete (`_cli.complete_checkpoints`) again only once this save
    is whole."""

    def on_step_end(self, args: TrainingArguments, state: object, control: object, **kwargs: object) -> None:
        if not control.should_save:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        rng_state = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
        for name in ("trainer_state.json", rng_state) if args.should_save else (rng_state,):
            (folder / name).unlink(missing_ok=True)

    on_epoch_end = on_step_end


class RecordProcesses(TrainerCallback, ExportableState):
    """Records in every checkpoint's trainer_state.json how many processes saved it: the main process writes that
    file without waiting for the others, so `_cli.complete_checkpoints` also wants each process's RNG state there."""

    def __init__(self, processes: int = 1) -> None:
        self.processes = processes

    def state(self) -> dict:
        return {"args": {}, "attributes": {"processes": self.processes}}

    def on_train_begin(self, args: TrainingArguments, state: object, control: object, **kwargs: object) -> None:
        self.processes = args.world_size
        state.stateful_callbacks[PROCESSES_KEY] = self.state()  # also in a state resumed from an older checkpoint


assert RecordProcesses.__name__ == PROCESSES_KEY  # the Trainer files a callback's state under its class name


def checkpoint_callbacks() -> list[TrainerCallback]:
    """The callbacks that keep a checkpoint from counting as complete before every process's part of it is saved."""
    return [UnmarkCheckpointBeforeSaving(), RecordProcesses()]


def train(trainer: Trainer) -> float:
    """`trainer.train()`, continued from --resume-from-checkpoint when it is given (model, optimiser, schedule, RNG
    states and the place in the data all come back, so the run goes on as if never stopped); returns the seconds
    this run trained. Under a launcher, a failed collective is reported with the processes that are gone
    (`ProcessWatch`)."""
    checkpoint = trainer.args.resume_from_checkpoint
    if checkpoint is not None:
        announce(f"resuming from {checkpoint}")
    with ProcessWatch.start():
        return trainer.train(resume_from_checkpoint=checkpoint).metrics["train_runtime"]


def start_process_group(args: argparse.Namespace) -> None:
    """Under a launcher without a GPU, join the gloo process group with --ddp-timeout before transformers or
    accelerate do: `TrainingArguments(use_cpu=True)` passes no timeout on (gloo's default is 30 minutes) and
    `from_pretrained(distributed_config=...)` uses two hours, so a process whose peer is gone without a word (a
    machine switched off, a network cut) would wait that long in its next collective.

    Under torchrun the group meets in a store of the first process's own (`_fresh_store`), not in torchrun's: torchrun
    keeps its store across `--max-restarts`, and gloo, meeting there again, reads the addresses of the processes
    that died (torch 2.13, pytorch/pytorch#167288: "Connection refused" and no restart)."""
    if not distributed_without_gpu() or torch.distributed.is_initialized():
        return
    timeout = datetime.timedelta(seconds=args.ddp_timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # not torchrun's workers: its own rendezvous
        torch.distributed.init_process_group("gloo", timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = _fresh_store(rank, world_size, timeout)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def _fresh_store(rank: int, world_size: int, timeout: datetime.timedelta) -> torch.distributed.Store:
    """A store that only this attempt's processes use: the first serves it on a free port and says where in
    torchrun's store, with a word of its own; the others connect where it says until the store there answers with
    that word (what an earlier attempt left there points to a process that is gone)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    launcher = torch.distributed.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
    if rank == 0:
        store = torch.distributed.TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        word = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        store.set("turner/word", word)
        launcher.set("turner/process-group-store", f"{store.port} {word}")
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        store_port, word = launcher.get("turner/process-group-store").decode().split()
        with contextlib.suppress(torch.distributed.DistError):
            store = torch.distributed.TCPStore(
                host, int(store_port), is_master=False, timeout=datetime.timedelta(seconds=2), wait_for_workers=False
            )
            if store.get("turner/word").decode() == word:
                store.set_timeout(timeout)
                return store
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"process 0 did not open the process group's store within --ddp-timeout {timeout.total_seconds():g}"
            )
        time.sleep(0.1)


class ProcessWatch:
    """Names the processes of a multi-process run that are gone when a collective fails.

    Each process counts up a key of its own in the launchers' store (torchrun's TCPStore at MASTER_ADDR:MASTER_PORT,
    which the launcher of every node reaches) from a thread, every `BEAT` seconds, and says there where it runs.
    When a collective fails, the counts that do not move within `LISTEN` seconds are the processes that died or froze;
    a store that does not answer means the node that serves it (the first node) is gone. torchrun keeps its store
    across restarts, so each process counts under a name of its own, which its rank's entry gives.
    """

    BEAT, LISTEN = 0.25, 3.0

    def __init__(self, rank: int, world_size: int) -> None:
        self.prefix = f"turner-watch/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        self.rank, self.world_size = rank, world_size
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        store = self._store()
        name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        where = f"node {os.environ.get('GROUP_RANK', '?')} (host {socket.gethostname()}, launcher pid {os.getppid()})"
        store.set(f"{self.prefix}/where/{rank}", f"{name} pid {os.getpid()} on {where}")
        self.stopped = threading.Event()
        threading.Thread(target=self._beat, args=(store, name), daemon=True, name="turner-heartbeat").start()

    @classmethod
    @contextlib.contextmanager
    def start(cls) -> Iterator[None]:
        """Watch the other processes while the block runs (a no-op outside a multi-process launcher)."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1 or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            yield
            return
        watch = cls(int(os.environ["RANK"]), world_size)
        try:
            yield
        except Exception as error:
            if isinstance(error, torch.distributed.DistError) or "gloo" in str(error):  # a collective failed
                print(f"\n{watch.lost()}", file=sys.stderr, flush=True)
            raise
        finally:
            watch.stopped.set()

    def _store(self) -> torch.distributed.Store:
        host, port = self.address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.LISTEN)
        return torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timeout, wait_for_workers=False)

    def _beat(self, store: torch.distributed.Store, name: str) -> None:
        while not self.stopped.wait(self.BEAT):
            try:
                store.add(f"{self.prefix}/beat/{name}", 1)
            except torch.distributed.DistError:  # the store is gone: `lost` says so
                return

    def lost(self) -> str:
        """One line: which processes stopped beating, and where they ran."""
        try:
            store = self._store()
            where = {}
            for rank in range(self.world_size):
                key = f"{self.prefix}/where/{rank}"
                where[rank] = store.get(key).decode().split(" ", 1) if store.check([key]) else ["", "not started"]
            before = {rank: store.add(f"{self.prefix}/beat/{name}", 0) for rank, (name, _) in where.items()}
            time.sleep(self.LISTEN)
            gone = [
                rank
                for rank, (name, _) in where.items()
                if rank != self.rank and store.add(f"{self.prefix}/beat/{name}", 0) == before[rank]
            ]
        except torch.distributed.DistError as error:  # the store client cannot reach the store
            return (
                f"lost the launchers' store at {self.address} ({type(error).__name__}): the node that serves it (the "
                "first node) is gone, or its launcher has stopped"
            )
        if not gone:
            return f"a collective failed, but every other process of {self.world_size} is still running"
        names = "; ".join(f"process {rank} ({where[rank][1]})" for rank in gone)
        return f"lost {len(gone)} of {self.world_size} processes, silent for {self.LISTEN:g} s: {names}"


def is_main_process() -> bool:
    """False in every process but the first under a multi-process launcher; for messages printed once."""
    return int(os.environ.get("RANK", "0")) == 0


def announce(message: str) -> None:
    """Print `message` once, from the main process, however many processes run the script."""
    if is_main_process():
        print(message)


def distributed_without_gpu() -> bool:
    """True under a multi-process launcher (torchrun, `accelerate launch`) on a machine without CUDA: the processes
    then train on the CPU and talk through gloo."""
    return not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def loss_curve(trainer: Trainer) -> list[tuple[int, float]]:
    """(step, training loss) for every logged step."""
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def print_loss_curve(trainer: Trainer, points: int = 8) -> None:
    """One line that shows the training loss falling, from the first logged step to the last."""
    curve = loss_curve(trainer)
    if not curve or not trainer.is_world_process_zero():
        return
    picks = sorted({round(i * (len(curve) - 1) / max(points - 1, 1)) for i in range(points)})
    print("training loss: " + " -> ".join(f"{curve[i][1]:.2f} (step {curve[i][0]})" for i in picks))


def count_parameters(model: PreTrainedModel) -> int:
    """Distinct trainable and frozen parameters (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def run_summary(trainer: Trainer, train_runtime: float) -> dict[str, object]:
    """How the model was trained, as rows of the model card's training table."""
    args, state = trainer.args, trainer.state
    device = "CPU" if args.device.type == "cpu" else torch.cuda.get_device_name(args.device)
    curve = loss_curve(trainer)
    optimizer, schedule = (getattr(v, "value", v) for v in (args.optim, args.lr_scheduler_type))
    return {
        "optimiser steps": state.global_step,
        "epochs": f"{state.epoch:.2f}",
        "batch size": f"{args.per_device_train_batch_size} per process x {args.world_size} process(es) x "
        f"{args.gradient_accumulation_steps} accumulation",
        "learning rate": f"{args.learning_rate:g}, {schedule} schedule, warm-up {args.warmup_steps:g}",
        "optimiser": f"{optimizer}, weight decay {args.weight_decay:g}",
        "hardware": f"{args.world_size} x {device} ({torch.get_num_threads()} threads per process)",
        "parallelism": parallelism(trainer),
        "training time": f"{train_runtime:.0f} s",
        "final training loss": f"{curve[-1][1]:.4f}" if curve else "n/a",
        "seed": args.seed,
    }


def shard(model: PreTrainedModel, args: argparse.Namespace) -> PreTrainedModel:
    """With `--fsdp-size N`, the model loaded again sharded by transformers' FSDP2 plan (`DistributedConfig(
    fsdp_size=N)`): each process holds 1/N of every weight, and the `Trainer` trains it as it is. Every process saves
    its own copy first (the same seed made the same weights), so nothing is shared through the file system."""
    fsdp_size = getattr(args, "fsdp_size", 1)
    if fsdp_size == 1:
        return model
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)  # before the process group: with one, only the first process would write
        start_process_group(args)
        return type(model).from_pretrained(folder, distributed_config=DistributedConfig(fsdp_size=fsdp_size))


def parallelism(trainer: Trainer) -> str:
    """How the processes shared the work: FSDP, DeepSpeed, DDP, or none."""
    if (fsdp_size := getattr(trainer.model, "fsdp_size", None) or 1) > 1:
        return f"FSDP2 over {fsdp_size} processes (transformers' plan: DistributedConfig(fsdp_size={fsdp_size}))"
    if trainer.is_fsdp_enabled:
        return f"FSDP{trainer.accelerator.state.fsdp_plugin.fsdp_version} over {trainer.args.world_size} processes"
    if trainer.is_deepspeed_enabled:
        return f"DeepSpeed over {trainer.args.world_size} processes"
    if trainer.args.world_size > 1:
        return f"DDP over {trainer.args.world_size} processes ({torch.distributed.get_backend()})"
    return "none (1 process)"


def accuracy(eval_prediction: tuple) -> dict[str, float]:
    """`compute_metrics` for the classifiers: the fraction of argmax predictions equal to the label."""
    logits, labels = eval_prediction
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def check_sample_length(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast, config: object) -> None:
    """Before training: the prompt plus --max-new-tokens must fit the model's learned positions."""
    if config.position_embedding_type != "learned":
        return
    prompt_length = len(tokenizer(args.prompt)["input_ids"])
    room = config.max_position_embeddings - prompt_length
    if args.max_new_tokens > room:
        raise UsageError(
            f"argument --max-new-tokens: {args.max_new_tokens} is not valid: the model has "
            f"{config.max_position_embeddings} positions and the prompt takes {prompt_length}; use at most {room}"
        )


def generate_sample(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompt: str, max_new_tokens: int, seed: int
) -> str:
    """Text from `pipeline("text-generation")`: `prompt` continued by top-10 sampling."""
    set_seed(seed)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    return generator(prompt, max_new_tokens=max_new_tokens, do_sample=True, top_k=10)[0]["generated_text"]


def save_with_card(
    trainer: Trainer,
    *,
    task: str,
    results: dict[str, float],
    train_runtime: float,
    notes: dict[str, object] | None = None,
    **card: object,
) -> None:
    """Save model, code, tokenizer or processor (the Trainer's `processing_class`) and a filled model card; `notes`
    are extra rows of the card's training table, `card` goes to `write_model_card`.

    Every process must call it (saving a sharded model is collective); only the main process writes the card.
    """
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    if not trainer.is_world_process_zero():
        return
    model = trainer.model
    card_path = write_model_card(
        output_dir,
        model.config,
        task=task,
        model_id=output_dir,
        results=results,
        training={**run_summary(trainer, train_runtime), **(notes or {})},
        num_parameters=count_parameters(model),
        **card,
    )
    files = sorted(p.name for p in Path(output_dir).iterdir() if p.is_file())
    print(f"saved to {output_dir}/: {', '.join(files)}")
    print(f"model card: {card_path}")


def perplexity(eval_loss: float) -> float:
    """exp(mean cross-entropy per token)."""
    return math.exp(eval_loss)


def load_text_corpus(args: argparse.Namespace, default: str = "docstrings") -> tuple[str, str, str]:
    """The text named by `_cli.add_text_data_arguments`: (text, readable name, dataset id for the card).

    `default` picks the built-in corpus: "docstrings" (`stdlib_docstrings`) or "code" (`stdlib_code`).
    """
    if args.train_file is not None:
        try:
            text = args.train_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(
                f"argument --train-file: {str(args.train_file)!r} is not valid: not UTF-8 text ({error})"
            ) from None
        name = args.train_file.stem
    elif args.dataset_name is not None:
        from datasets import load_dataset

        dataset = load_dataset(args.dataset_name, args.dataset_config_name, split=args.dataset_split)
        if args.text_column not in dataset.column_names:
            raise UsageError(
                f"argument --text-column: {args.text_column!r} is not valid: the dataset's columns are "
                f"{dataset.column_names}"
            )
        text = "\n\n".join(str(row) for row in dataset[args.text_column])
        name = args.dataset_name.rstrip("/").split("/")[-1] if Path(args.dataset_name).exists() else args.dataset_name
    elif default == "code":
        return stdlib_code(), STDLIB_CODE_NAME, STDLIB_CODE_ID
    else:
        return stdlib_docstrings(), STDLIB_DOCS_NAME, STDLIB_DOCS_ID
    if not text.strip():
        raise UsageError("the training text is empty: pass a --train-file or --dataset-name with text in it")
    return text, name, name


def causal_lm_trainer(
    args: argparse.Namespace,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train_text: str,
    eval_text: str,
    **training_overrides: object,
) -> Trainer:
    """A `Trainer` for next-token prediction on `train_text`, evaluated on `eval_text`: in blocks of --block-size, or
    with --padding-free paragraphs packed in one row per batch (`_padding_free`)."""
    if getattr(args, "padding_free", False):
        import _padding_free

        sequences, collator = _padding_free.paragraph_sequences, _padding_free.collator(True, tokenizer)
    else:
        sequences, collator = token_blocks, default_data_collator
    return Trainer(
        model=shard(model, args),
        args=training_arguments(args, **training_overrides),
        train_dataset=sequences(tokenizer, train_text, args.block_size, "training"),
        eval_dataset=sequences(tokenizer, eval_text, args.block_size, "held-out"),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=checkpoint_callbacks(),
    )


def finish_causal_lm(
    trainer: Trainer, args: argparse.Namespace, train_runtime: float, **card: object
) -> dict[str, float]:
    """After training: show the loss curve, measure held-out loss and perplexity, print a pipeline sample, save the
    model, tokenizer and card (`card`: `dataset_name`, `dataset_id`, `base_model`, `notes`; see `save_with_card`)."""
    print_loss_curve(trainer)
    eval_loss = trainer.evaluate()["eval_loss"]
    results = {"eval_loss": eval_loss, "perplexity": perplexity(eval_loss)}
    # every process generates: a sharded model's forward pass needs them all
    sample = generate_sample(trainer.model, trainer.processing_class, args.prompt, args.max_new_tokens, args.seed)
    if trainer.is_world_process_zero():
        print(f"held-out loss {eval_loss:.3f} nats/token, perplexity {results['perplexity']:.2f}")
        print(f"\nsample from pipeline('text-generation'):\n{sample}\n")
    save_with_card(
        trainer,
        task="text-generation",
        results=results,
        train_runtime=train_runtime,
        example_input=args.prompt,
        **card,
    )
    return results


def labelled_dataset(column: str, values: list, labels: list[str], names: list[str] | None = None) -> Dataset:
    """A `Dataset` with `column` ("text": strings, or "image": PIL images or file paths) and a `label` column of
    class ids; `names` (default: the sorted labels) fixes the order of the classes, and a label outside it is an
    error."""
    from datasets import ClassLabel, Features, Image, Value

    names = names if names is not None else sorted(set(labels))
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise UsageError(f"the test data has labels the training data lacks: {unknown[:5]}; known labels: {names}")
    feature = Value("string") if column == "text" else Image()
    features = Features({column: feature, "label": ClassLabel(names=names)})
    return Dataset.from_dict({column: values, "label": [names.index(label) for label in labels]}, features=features)


def split_train_test(dataset: Dataset, test_percentage: float, seed: int) -> tuple[Dataset, Dataset]:
    """A stratified random split (each class keeps its share in both parts)."""
    parts = dataset.train_test_split(test_size=test_percentage / 100, seed=seed, stratify_by_column="label")
    return parts["train"], parts["test"]


def label_maps(dataset: Dataset) -> dict[str, dict]:
    """`id2label` and `label2id` for a config, from the dataset's `label` column."""
    names = dataset.features["label"].names
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def train_classifier(
    args: argparse.Namespace,
    model: PreTrainedModel,
    train_dataset: Dataset,
    eval_dataset: Dataset,
    processor: object,
    *,
    task: str,
    examples: list,
    data_collator: object = None,
    training_overrides: dict | None = None,
    **card: object,
) -> dict[str, float]:
    """Train with the `Trainer`, then: test accuracy, `pipeline(task)` on a few `examples`, and save model, processor
    (tokenizer or image processor) and card (`card`: see `save_with_card`)."""
    trainer = Trainer(
        model=shard(model, args),
        args=training_arguments(args, **(training_overrides or {})),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=data_collator,
        processing_class=processor,
        compute_metrics=accuracy,
        callbacks=checkpoint_callbacks(),
    )
    train_runtime = train(trainer)
    print_loss_curve(trainer)
    metrics = trainer.evaluate()
    results = {"accuracy": metrics["eval_accuracy"]}
    processor = {"image_processor" if task == "image-classification" else "tokenizer": trainer.processing_class}
    classify = pipeline(task, model=trainer.model, **processor)
    cut = {"truncation": True} if task == "text-classification" else {}  # a text longer than --max-length
    predicted = classify(examples, top_k=1, **cut)  # every process: a sharded model's forward pass needs them all
    if trainer.is_world_process_zero():
        print(f"test accuracy: {results['accuracy']:.4f} on {len(trainer.eval_dataset)} held-out examples")
        print(f"\npipeline('{task}'):")
        for example, predictions in zip(examples, predicted, strict=True):
            shown = repr(example) if isinstance(example, str) else f"<image {example.size[0]}x{example.size[1]}>"
            print(f"  {shown} -> {predictions[0]['label']} ({predictions[0]['score']:.2f})")
        print()
    save_with_card(trainer, task=task, results=results, train_runtime=train_runtime, **card)
    return results
