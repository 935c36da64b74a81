"""The data the example scripts train on when given none, and what turns text into training sequences: the built-in
corpora (text that ships with Python: nothing to download), scikit-learn's digits, tokenizers trained on the spot,
text cut into blocks of tokens, and a classifier's examples as training and test `Dataset`s.
"""

import ast
import importlib
import inspect
import io
import keyword
import random
import tokenize
from collections.abc import Iterable
from pathlib import Path

from datasets import ClassLabel, Dataset, Features
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .training import UsageError

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


# What a token-classification model learns to tag in a line of Python: `tokenize`'s kinds, keywords apart from names
PYTHON_TOKEN_KINDS = {tokenize.NAME: "name", tokenize.NUMBER: "number", tokenize.STRING: "string", tokenize.OP: "op"}


def python_token_tags(lines: int, seed: int) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """The default token-classification task: lines of the standard library's code, each with the (start, end, tag)
    of its words as Python's own `tokenize` reads them: `keyword`, `name`, `number`, `string` or `op`. Lines that do
    not tokenize alone (an open bracket) are passed over."""
    code = sorted({line.strip() for line in stdlib_code().splitlines() if 20 <= len(line.strip()) <= 80})
    tagged = []
    for line in random.Random(seed).sample(code, len(code)):
        try:
            words = list(tokenize.generate_tokens(io.StringIO(line).readline))
        except (tokenize.TokenError, SyntaxError):
            continue
        spans = [
            (word.start[1], word.end[1], "keyword" if keyword.iskeyword(word.string) else PYTHON_TOKEN_KINDS[word.type])
            for word in words
            if word.type in PYTHON_TOKEN_KINDS
        ]
        tagged.append((line, spans))
        if len(tagged) == lines:
            break
    return tagged


def which_line(questions: int, calls_per_context: int, seed: int) -> list[tuple[str, str, str, int]]:
    """The default question-answering task: (question, context, answer, where the answer starts in the context). The
    context lists a few calls of the standard library's public functions at line numbers drawn at random ("line 212
    calls dumps."), the question asks for one ("Which line calls dumps?"), and the answer is its number, a span of
    the context: found only by reading the context, as nothing ties a function to a number."""
    names = sorted(
        {name for module in _stdlib_modules() for name, obj in vars(module).items()
         if inspect.isfunction(obj) and not name.startswith("_") and obj.__module__ == module.__name__}
    )  # fmt: skip
    rng = random.Random(seed)
    rows = []
    for _ in range(questions):
        numbers, called = rng.sample(range(1, 1000), calls_per_context), rng.sample(names, calls_per_context)
        calls = list(zip(numbers, called, strict=True))
        line, name = rng.choice(calls)
        context = " ".join(f"line {number} calls {function}." for number, function in calls)
        start = context.index(f"line {line} calls {name}.") + len("line ")
        rows.append((f"Which line calls {name}?", context, str(line), start))
    return rows


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


def text_tokenizer(kind: str, text: str, vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """The tokenizer a language-model script trains on `text`: `kind` "bpe" (`bpe_tokenizer` over its lines, of
    `vocab_size` tokens) or "char" (`char_tokenizer`)."""
    if kind == "bpe":
        return bpe_tokenizer(text.splitlines(keepends=True), vocab_size, model_max_length)
    return char_tokenizer([text], model_max_length)


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
        raise ValueError(f"the {what} text has {len(ids)} tokens, fewer than one block of {block_size}")
    blocks = [ids[i * block_size : (i + 1) * block_size] for i in range(count)]
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


def load_text(
    train_file: str | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    dataset_split: str = "train",
    text_column: str = "text",
    default: str = "docstrings",
) -> tuple[str, str, str]:
    """(text, readable name, dataset id for the card) of a UTF-8 file, the `text_column` of a `datasets` dataset, or
    else a built-in corpus: `default` "docstrings" (`stdlib_docstrings`) or "code" (`stdlib_code`)."""
    if train_file is not None:
        try:
            text = Path(train_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"{train_file!r} is not UTF-8 text ({error})") from None
        name = Path(train_file).stem
    elif dataset_name is not None:
        from datasets import load_dataset

        try:
            dataset = load_dataset(dataset_name, dataset_config_name, split=dataset_split)
        except (FileNotFoundError, ConnectionError) as error:  # no such folder here, nor a Hub dataset it could reach
            raise UsageError(
                f"--dataset_name {dataset_name!r} is not valid: no folder of that name in {Path.cwd()}, and no "
                f"dataset of that id on the Hub ({type(error).__name__}); give a folder of data files or a Hub id"
            ) from None
        if text_column not in dataset.column_names:
            raise UsageError(f"the dataset has no column {text_column!r}: its columns are {dataset.column_names}")
        text = "\n\n".join(str(row) for row in dataset[text_column])
        name = dataset_name.rstrip("/").split("/")[-1] if Path(dataset_name).exists() else dataset_name
    elif default == "code":
        return stdlib_code(), STDLIB_CODE_NAME, STDLIB_CODE_ID
    else:
        return stdlib_docstrings(), STDLIB_DOCS_NAME, STDLIB_DOCS_ID
    if not text.strip():
        raise UsageError(f"the training text of {name!r} is empty")
    return text, name, name


def digits() -> tuple[list, list[str]]:
    """scikit-learn's 8x8 digits as greyscale PIL images (0..16 scaled to 0..255) and their labels "0".."9"."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    images = [Image.fromarray((pixels * 255 / 16).astype(np.uint8), mode="L") for pixels in data.images]
    return images, [str(label) for label in data.target]


def labelled(column: str, feature: object, values: list, labels: list[str], names: list[str] | None = None) -> Dataset:
    """A `Dataset` of `column` (the examples, of the `datasets` feature `feature`) and `label` (class ids of `names`,
    by default the sorted labels)."""
    names = names if names is not None else sorted(set(labels))
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise ValueError(f"the test data has labels the training data lacks: {unknown[:5]}; known labels: {names}")
    features = Features({column: feature, "label": ClassLabel(names=names)})
    return Dataset.from_dict({column: values, "label": [names.index(label) for label in labels]}, features=features)


def train_and_test(
    column: str,
    feature: object,
    train: tuple[list, list[str]],
    test: tuple[list, list[str]] | None,
    test_split: float,
    seed: int,
) -> tuple[Dataset, Dataset]:
    """(train, test) `labelled` datasets of a classifier's (examples, labels), the test labels named as the training
    ones; without `test`, a stratified split of `train` that holds out `test_split` % (each class keeps its share in
    both parts)."""
    train_set = labelled(column, feature, *train)
    if test is None:
        parts = train_set.train_test_split(test_split / 100, seed=seed, stratify_by_column="label")
        return parts["train"], parts["test"]
    return train_set, labelled(column, feature, *test, train_set.features["label"].names)
