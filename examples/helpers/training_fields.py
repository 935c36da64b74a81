"""Every field of `transformers.TrainingArguments` as the keywords of a command-line flag, read from the installed
transformers' source and converted the way `HfArgumentParser` converts a dataclass field (`--learning_rate`, with
`--learning-rate` as an alias; a switch takes an optional true/false; one on by default also has `--no_<name>`).

Stands in for `HfArgumentParser(TrainingArguments)` before the scripts' flags are checked: importing
`TrainingArguments` loads torch (seconds), and `--help` and a bad value should answer at once. Reading the source
also means a new transformers release's fields are flags the day it is installed. tests/test_example_flags.py checks
the result against `HfArgumentParser(TrainingArguments)` itself.
"""

import argparse
import ast
import contextlib
import dataclasses
import importlib.util
import json
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path


def boolean(text: str) -> bool:
    """An argparse type for true/false, spelled as `HfArgumentParser` takes them."""
    if text.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if text.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected true or false (yes/no, t/f, y/n, 1/0)")


def options(name: str) -> list[str]:
    """A flag's spellings: the field's name, then with dashes (`--max_steps`, `--max-steps`)."""
    return [f"--{name}", f"--{name.replace('_', '-')}"] if "_" in name else [f"--{name}"]


class _Opaque:
    """A type the source names but the command line cannot give (an object such as accelerate's ParallelismConfig)."""


class _Names(dict):
    """The names a `TrainingArguments` annotation may use; any other is a class imported from elsewhere."""

    def __missing__(self, name: str) -> type:
        self[name] = type(name, (_Opaque,), {})
        return self[name]


def _transformers_source(module: str) -> ast.Module:
    """The parsed source of `transformers.<module>`, found without importing transformers."""
    path = Path(importlib.util.find_spec("transformers").origin).parent.joinpath(*module.split("."))
    return ast.parse(path.with_suffix(".py").read_text(encoding="utf-8"))


def _enums(tree: ast.Module, names: set[str], follow_imports: bool = True) -> dict[str, type]:
    """The Enum classes among `names` defined in `tree`, or in the transformers modules it imports them from, rebuilt
    from their `MEMBER = "value"` lines."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names and any("Enum" in ast.unparse(b) for b in node.bases):
            members = {
                statement.targets[0].id: statement.value.value
                for statement in node.body
                if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
            }
            found[node.name] = Enum(node.name, members)
        elif follow_imports and isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            imported = names & {alias.name for alias in node.names}
            path = Path(importlib.util.find_spec("transformers").origin).parent.joinpath(*node.module.split("."))
            if imported and path.with_suffix(".py").is_file():  # a module, not a package
                found |= _enums(_transformers_source(node.module), imported, follow_imports=False)
    return found


def _value(node: ast.expr | None, names: _Names) -> object:
    """A default or metadata value from the source: a literal, an Enum member's value, a builtin (a default
    factory), or `_UNREAD` for one the source computes (e.g. the default optimiser, from the torch version)."""
    if node is None:
        return dataclasses.MISSING
    with contextlib.suppress(ValueError, SyntaxError):
        return ast.literal_eval(node)
    try:
        value = eval(compile(ast.Expression(node), "<TrainingArguments>", "eval"), {"__builtins__": {}}, names)
    except Exception:
        return _UNREAD
    if isinstance(value, type) and issubclass(value, _Opaque):
        return _UNREAD
    return value.value if isinstance(value, Enum) else value


_UNREAD = object()


def training_flags() -> dict[str, dict[str, object]]:
    """{field: `add_argument` keywords} for every field of `TrainingArguments` that `__init__` takes, with the option
    strings under "options", read from the installed transformers' training_args.py and converted as
    `HfArgumentParser` converts a dataclass field. A field whose type a command line cannot give gets "opaque"."""
    tree = _transformers_source("training_args")
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments")
    fields = [node for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]
    used = {name.id for node in fields for name in ast.walk(node.annotation) if isinstance(name, ast.Name)}
    names = _Names({"Any": typing.Any, "Literal": typing.Literal, "Union": typing.Union, "Optional": typing.Optional})
    names |= {kind.__name__: kind for kind in (bool, int, float, str, dict, list, tuple)} | _enums(tree, used)
    flags = {}
    for node in fields:
        call = node.value if isinstance(node.value, ast.Call) else None
        keywords = {k.arg: k.value for k in call.keywords} if call else {}
        if _value(keywords.get("init"), names) is False:
            continue
        default = _value(keywords.get("default", None if call else node.value), names)
        factory = _value(keywords["default_factory"], names) if "default_factory" in keywords else None
        metadata = {}
        if isinstance(keywords.get("metadata"), ast.Dict):
            for key, value in zip(keywords["metadata"].keys, keywords["metadata"].values, strict=True):
                if (value := _value(value, names)) is not _UNREAD:  # choices computed at import: checked later
                    metadata[ast.literal_eval(key)] = value
        kind = eval(compile(ast.Expression(node.annotation), "<TrainingArguments>", "eval"), {}, names)
        flags[node.target.id] = _keywords(node.target.id, kind, default, factory, metadata)
    return flags


def _keywords(name: str, kind: object, default: object, factory: Callable | None, metadata: dict) -> dict[str, object]:
    """`add_argument` keywords for a field of type `kind`, the way `HfArgumentParser` reads a dataclass field: a
    union with `str` is its other type, `X | None` is X (but `bool | None` stays a switch that may be unset), an Enum
    or Literal gives choices, a bool a switch with an optional value, a list one or more values (its default only
    from a factory). Two additions: a dict is JSON text (or, where transformers takes one, a JSON file), checked here,
    and a type no command line can give (an object) is marked "opaque"."""
    keywords = {"options": [*options(name), *metadata.pop("aliases", [])], **metadata}
    members = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, type(int | str)) else ()
    if dict in members or any(typing.get_origin(member) is dict for member in members):
        return keywords | {"type": json_or_path, "default": None if default is dataclasses.MISSING else default}
    if members and type(None) not in members:  # `X | str`
        kind = members[0] if members[1] is str else members[1]
    elif members and set(members) != {bool, type(None)}:  # `X | None`, `X | str | None`
        kind = members[0] if members[1] is type(None) else members[1]
    if default is _UNREAD:  # computed when transformers loads: TrainingArguments keeps its own
        keywords["help"] = f"{keywords.get('help', '')} (default: TrainingArguments' own)".strip()
        default = None
    default = factory() if factory is not None else None if default is dataclasses.MISSING else default
    element = typing.get_args(kind)[0] if typing.get_origin(kind) is list else None
    if typing.get_origin(kind) is typing.Literal or _is_enum(kind):
        choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else [m.value for m in kind]
        keywords |= {"choices": list(choices), "type": str, "default": default}
    elif kind is bool or set(members) == {bool, type(None)}:
        keywords |= {"type": boolean, "negative": default is True}
        if kind is bool or default is not None:  # argparse reads a text default ("no") through the type
            keywords |= {"default": False if default is None else default, "nargs": "?", "const": True}
    elif element is not None:
        keywords |= {"nargs": "+", "default": factory() if factory is not None else None}
        keywords |= {"type": str, "choices": [m.value for m in element]} if _is_enum(element) else {"type": element}
    else:
        keywords |= {"type": kind, "default": default, "opaque": isinstance(kind, type) and issubclass(kind, _Opaque)}
    return keywords


def _is_enum(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, Enum)


def json_or_path(text: str) -> dict | str:
    """An argparse type for a JSON object (`--lr_scheduler_kwargs '{"num_cycles": 2}'`), or the path of a JSON file
    (`--deepspeed ds_config.json`)."""
    with contextlib.suppress(ValueError):
        value = json.loads(text)
        if isinstance(value, dict):
            return value
    if Path(text).is_file():
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not valid: expected a JSON object such as '{{\"key\": 1}}', or a JSON file"
    )
