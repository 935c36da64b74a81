"""The command line: `python -m convert {gpt2,vit,bert} SRC OUT [--reverse]` from a clone of the repository; once
installed, `turner-convert ...` or `python -m turner_tfm.convert ...`.

Forward, SRC is a checkpoint of the named family (a folder or a Hub id); OUT gets the Turner model
(`save_pretrained`: weights, config with `auto_map`, the model code) and SRC's companions: its tokenizer or image
processor, its generation config, and its sentence-transformers modules (`modules.json`, `1_Pooling/`,
`2_Normalize/`, ... with their configs), so `pipeline()`, `AutoModel*.from_pretrained` and `SentenceTransformer`
work on OUT as they did on SRC. With `--reverse`, SRC is a Turner checkpoint and OUT gets the family's model, with the
same companions. Either way the command runs one random input through both models, prints the largest difference of
their outputs, and names SRC's files it did not carry (a model card describes SRC, other weight formats, ...).
"""

import argparse
import json
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import torch
from huggingface_hub import list_repo_files
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.utils import cached_file, has_file
from transformers.utils import logging as transformers_logging

from turner_tfm import TurnerConfig

from . import bert, gpt2, vit
from ._common import Converter

FAMILIES: dict[str, tuple[Converter, str]] = {
    "gpt2": (gpt2.CONVERTER, gpt2.__doc__),
    "vit": (vit.CONVERTER, vit.__doc__),
    "bert": (bert.CONVERTER, bert.__doc__),
}
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
_IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
_GENERATION_FILE = "generation_config.json"
# sentence-transformers: the pipeline of modules, and the configs of the whole model and of its Transformer module
_SENTENCE_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
# what OUT gets anew rather than copied: the weights (rewritten) and the git metadata of a Hub repo
_REWRITTEN = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", ".gitattributes")
_OUTPUT_NAMES = ("logits", "start_logits", "end_logits", "last_hidden_state", "pooler_output")


@dataclass
class Outcome:
    """What one conversion did, for the summary the CLI prints."""

    from_class: str  # the class loaded from SRC
    to_class: str  # the class written to OUT
    tensors_in: int
    tensors_out: int
    parameters: int
    dtype: torch.dtype
    max_difference: float
    compared: list[str]
    copied: list[str]
    unused: list[str]
    not_carried: list[str]

    def lines(self, src: str, out: str) -> list[str]:
        dtype = str(self.dtype).removeprefix("torch.")
        lines = [
            f"{self.from_class} ({src}) -> {self.to_class} ({out})",
            f"  tensors: {self.tensors_in} in, {self.tensors_out} out; {self.parameters:,} parameters in {dtype}",
            f"  one random input through both: max |difference| = {self.max_difference:.3g} "
            f"({', '.join(self.compared)})",
            f"  copied from SRC: {', '.join(self.copied) or 'nothing (no tokenizer or image processor in SRC)'}",
        ]
        if self.unused:
            lines.append(f"  left in SRC, unused by {self.from_class}: {', '.join(self.unused)}")
        if self.not_carried:
            lines.append(f"  files of SRC not carried to OUT: {', '.join(self.not_carried)}")
        return lines


def convert_checkpoint(
    family: str,
    src: str,
    out: str,
    reverse: bool = False,
    architecture: str | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Outcome:
    """Load SRC, convert it (to Turner, or back with `reverse`), save it to OUT with SRC's pre-processing."""
    if family not in FAMILIES:
        raise ValueError(f"`family`={family!r} is not supported; choose one of {list(FAMILIES)}.")
    converter = FAMILIES[family][0]
    overrides = dict(overrides or {})
    config = read_config(src)
    expected = TurnerConfig.model_type if reverse else converter.config_class.model_type
    if config.model_type != expected:
        hint = (
            "; add --reverse to turn a Turner checkpoint back" if config.model_type == TurnerConfig.model_type else ""
        )
        raise ValueError(f"SRC {src!r} holds a {config.model_type!r} checkpoint, expected {expected!r}{hint}.")
    architecture = architecture or _saved_architecture(converter, config, reverse)
    head = converter.head(architecture)
    if reverse:
        turner, unused = _load(head.turner_class, src, overrides, optional_pooler=False)
        source = target = converter.model_from_turner(turner, architecture)
    else:
        source, unused = _load(head.source_class, src, overrides, optional_pooler=head.pooler is None)
        turner = target = converter.model_to_turner(source)
    difference, compared = max_difference(source, turner)
    target.save_pretrained(out)
    copied = copy_companions(src, out)
    loaded = turner if reverse else source
    return Outcome(
        from_class=type(loaded).__name__,
        to_class=type(target).__name__,
        tensors_in=len(loaded.state_dict()),
        tensors_out=len(target.state_dict()),
        parameters=target.num_parameters(),
        dtype=target.dtype,
        max_difference=difference,
        compared=compared,
        copied=copied,
        unused=unused,
        not_carried=not_carried(src, out),
    )


def read_config(src: str) -> PreTrainedConfig:
    """SRC's config; a SRC that cannot be read (no such folder, no config.json in it, a Hub id that is offline or
    unknown) is refused in one line that says what was tried."""
    try:
        return AutoConfig.from_pretrained(src)
    except OSError as error:
        here = "a folder without config.json" if Path(src).is_dir() else f"no folder of that name in {Path.cwd()}"
        reason = str(error).strip().splitlines()[0]
        raise ValueError(
            f"cannot read SRC {src!r}: {here}, and as a Hub id: {reason} Give a checkpoint folder, or a Hub id "
            "with the network on (HF_HUB_OFFLINE unset) or in the Hugging Face cache."
        ) from None


def _saved_architecture(converter: Converter, config: PreTrainedConfig, reverse: bool) -> str:
    """The family class SRC was saved as (for a Turner SRC: the family class its Turner class converts to)."""
    if not config.architectures:
        raise ValueError(f"SRC's config names no architecture; pass --architecture (one of {list(converter.heads)}).")
    saved = config.architectures[0]
    return converter.architecture_for(saved) if reverse else saved


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """Hide transformers' load report: `_load` checks the loading info itself."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def _load(
    model_class: type[PreTrainedModel], src: str, overrides: Mapping[str, object], optional_pooler: bool
) -> tuple[PreTrainedModel, list[str]]:
    """`model_class.from_pretrained(src)` and the names of SRC's tensors it leaves unused.

    Refuses a checkpoint that lacks some of the class's weights (they would be random). A BERT or ViT base model
    saved without its pooler loads with `add_pooling_layer=False` instead.
    """
    with _quiet_loading():
        model, info = model_class.from_pretrained(src, output_loading_info=True, **overrides)
        missing = sorted(info["missing_keys"])
        if optional_pooler and missing and all(key.startswith("pooler.") for key in missing):
            model, info = model_class.from_pretrained(
                src, output_loading_info=True, add_pooling_layer=False, **overrides
            )
            missing = sorted(info["missing_keys"])
    if missing:
        raise ValueError(
            f"SRC {src!r} lacks weights of {model_class.__name__}: {missing}; the conversion would carry random "
            "values. Pass --architecture with the class SRC was saved as."
        )
    return model, sorted(info["unexpected_keys"])


@torch.no_grad()
def max_difference(source: PreTrainedModel, turner: PreTrainedModel) -> tuple[float, list[str]]:
    """Run one random input through both models; the largest |difference| of the outputs they share, and their
    names."""
    config = turner.config
    generator = torch.Generator().manual_seed(0)
    if config.is_image_model:
        shape = (1, config.num_channels, config.image_size, config.image_size)
        inputs = {"pixel_values": torch.randn(shape, generator=generator)}
    else:
        length = min(8, config.max_position_embeddings)
        input_ids = torch.randint(0, config.vocab_size, (1, length), generator=generator)
        if config.pad_token_id is not None:  # real tokens only: the families differ in how they treat padding
            input_ids[input_ids == config.pad_token_id] = (config.pad_token_id + 1) % config.vocab_size
        inputs = {"input_ids": input_ids}
    first, second = source(**inputs), turner(**inputs)
    compared = [name for name in _OUTPUT_NAMES if first.get(name) is not None and second.get(name) is not None]
    difference = max((first[name].float() - second[name].float()).abs().max().item() for name in compared)
    return difference, compared


def copy_companions(src: str, out: str) -> list[str]:
    """Save what SRC has beside its model into OUT: tokenizer, image processor, generation config (unless the
    converted model wrote its own from SRC's), sentence-transformers modules. Returns what was carried."""
    copied = []
    if any(has_file(src, name) for name in _TOKENIZER_FILES):
        AutoTokenizer.from_pretrained(src).save_pretrained(out)
        copied.append("tokenizer")
    if has_file(src, _IMAGE_PROCESSOR_FILE):
        AutoImageProcessor.from_pretrained(src).save_pretrained(out)
        copied.append("image processor")
    if has_file(src, _GENERATION_FILE):
        if not (Path(out) / _GENERATION_FILE).is_file():
            GenerationConfig.from_pretrained(src).save_pretrained(out)
        copied.append("generation config")
    if has_file(src, _SENTENCE_FILES[0]):
        files = [name for name in _SENTENCE_FILES if has_file(src, name)] + sentence_module_files(src)
        for name in files:
            destination = Path(out) / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached_file(src, name), destination)
        copied.append(f"sentence-transformers modules ({', '.join(files)})")
    return copied


def sentence_module_files(src: str) -> list[str]:
    """The files of SRC's sentence-transformers modules that have their own folder (Pooling, Normalize, Dense...);
    the Transformer module (path "") is the converted model itself."""
    modules = json.loads(Path(cached_file(src, _SENTENCE_FILES[0])).read_text())
    folders = tuple(module["path"].strip("/") + "/" for module in modules if module.get("path"))
    files = source_files(src)
    if files is None:
        raise ValueError(f"Cannot list SRC {src!r}'s files to carry its sentence-transformers modules: go online.")
    return [name for name in files if name.startswith(folders)]


def source_files(src: str) -> list[str] | None:
    """Every file of SRC (a folder, or a Hub repo) as paths relative to it; None when the Hub cannot be asked."""
    if Path(src).is_dir():
        return sorted(path.relative_to(src).as_posix() for path in Path(src).rglob("*") if path.is_file())
    try:
        return sorted(list_repo_files(src))
    except OSError:  # offline, or the Hub unreachable
        return None


def not_carried(src: str, out: str) -> list[str]:
    """SRC's files that OUT has no copy of, weights aside (OUT holds them converted)."""
    files = source_files(src)
    if files is None:
        return ["(unknown: the Hub could not list SRC's files)"]
    missing = [name for name in files if not (Path(out) / name).is_file()]
    return [name for name in missing if not any(fnmatch(Path(name).name, pattern) for pattern in _REWRITTEN)]


def _override(text: str) -> tuple[str, object]:
    """`KEY=VALUE` -> (KEY, VALUE read as JSON, or as a string when it is not JSON)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE (e.g. classifier_dropout=0.0), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def program_name() -> str:
    """How the user ran the converter: the installed command, or `python -m` and this package's name."""
    command = Path(sys.argv[0]).name
    return command if command == "turner-convert" else f"python -m {__package__}"


def build_parser() -> argparse.ArgumentParser:
    prog = program_name()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        f"  {prog} gpt2 openai-community/gpt2 gpt2-turner\n"
        f"  {prog} gpt2 gpt2-turner gpt2-again --reverse\n"
        f"  {prog} bert sentence-transformers/all-MiniLM-L6-v2 minilm-turner\n"
        f"  {prog} vit google/vit-base-patch16-224 vit-turner\n"
        f"run `{prog} FAMILY --help` for what each family converts and refuses.",
    )
    families = parser.add_subparsers(dest="family", required=True, metavar="{gpt2,vit,bert}")
    for family, (converter, doc) in FAMILIES.items():
        sub = families.add_parser(
            family,
            help=f"{converter.name}: {', '.join(converter.heads)}",
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument("src", metavar="SRC", help="checkpoint folder or Hub id (passed to from_pretrained)")
        sub.add_argument("out", metavar="OUT", help="folder to write the converted checkpoint to")
        sub.add_argument(
            "--reverse", action="store_true", help=f"SRC is a Turner checkpoint; write it back as {converter.name}"
        )
        sub.add_argument(
            "--architecture",
            choices=list(converter.heads),
            help="the class to convert from (to, with --reverse); default: the one SRC was saved as",
        )
        sub.add_argument(
            "--set",
            dest="overrides",
            metavar="KEY=VALUE",
            type=_override,
            action="append",
            default=[],
            help="override a field of SRC's config before converting (VALUE is JSON); repeatable",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        outcome = convert_checkpoint(
            args.family, args.src, args.out, args.reverse, args.architecture, dict(args.overrides)
        )
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    print("\n".join(outcome.lines(args.src, args.out)))
    return 0
