"""Model cards for Turner checkpoints, filled from the config and the training run.

A card is a `README.md`: YAML front matter that the Hub reads (`library_name`, `pipeline_tag`, `tags`, `license`,
`datasets`, `metrics`, and the measured results as `model-index`), then what the model is, how it was trained, its
results and a usage snippet that loads it with `trust_remote_code=True`. The templates, one per task, are
`model_cards/*.md` in the repository and `turner_tfm.model_cards` installed: their front matter holds the fixed
fields, their body `${name}` slots that `render_model_card` fills. The card's "Model" section is read from the config:
the shape in the paper's symbols, then every choice field of `TurnerConfig` (each `bool` or `Literal` it declares)
with its value and default, the paper's switches it changes named first.

Example:

```python
>>> from turner_tfm import TurnerConfig
>>> from turner_tfm.cards import render_model_card
>>> card = render_model_card(
...     TurnerConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
...     task="text-generation", model_id="me/tiny", dataset_name="my-corpus", results={"perplexity": 5.1},
... )
>>> card.data.pipeline_tag
'text-generation'
```
"""

import dataclasses
import re
import string
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PreTrainedConfig

from .configuration_turner import TurnerConfig

# one per head: TurnerForCausalLM, ...SequenceClassification, ...ImageClassification, ...MaskedLM,
# ...TokenClassification, ...QuestionAnswering (TurnerModel, the backbone, is no task of its own)
TASKS = (
    "text-generation",
    "text-classification",
    "image-classification",
    "fill-mask",
    "token-classification",
    "question-answering",
    "multiple-choice",
)
CARD_NAME = "README.md"
PAPER = "Richard E. Turner, *An Introduction to Transformers* (2023), arXiv:2304.10557"

# metric key (as the scripts report it) -> (model-index metric type, name shown on the card)
METRICS = {
    "accuracy": ("accuracy", "Accuracy"),
    "perplexity": ("perplexity", "Perplexity"),
    "eval_loss": ("loss", "Cross-entropy loss (nats/token)"),
    "exact_match": ("exact_match", "Exact match"),
    "f1": ("f1", "F1 (token overlap with the answer)"),
}
# The shape's rows: config field -> the paper's name for it
SHAPE = {
    "num_hidden_layers": "blocks M",
    "hidden_size": "features D",
    "num_attention_heads": "heads H",
    "head_dim": "head size K",
    "intermediate_size": "MLP width",
    "hidden_act": "MLP activation",
}
# Where the paper discusses a switch; the card lists every choice field of the config, these with the reference
PAPER_SECTIONS = {
    "is_causal": "§4.1, the auto-regressive mask",
    "position_embedding_type": "§3, position encodings",
    "position_embedding_combine": "footnote 19, add or concatenate",
    "share_query_key": "footnote 9, U_q = U_k",
    "normalization": "figure 5, TokenNorm (LayerNorm) or another norm",
    "norm_position": "§2.3 and footnote 18, before or after the residual",
    "mlp_hidden_layers": "footnote 14, the MLP's hidden layers",
    "classifier_pooling": "§1.2, pooling for a global classification",
}
_MODEL_ID_LINE = re.compile(r'^model_id = ".*"$', flags=re.MULTILINE)
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", flags=re.DOTALL)


def template_text(task: str) -> str:
    """The raw template for `task` (one of `TASKS`), read from the installed package."""
    if task not in TASKS:
        raise ValueError(f"`task`={task!r} is invalid; choose one of {list(TASKS)}.")
    return (resources.files(f"{__package__}.model_cards") / f"{task}.md").read_text(encoding="utf-8")


def render_model_card(
    config: TurnerConfig,
    *,
    task: str,
    model_id: str,
    dataset_name: str,
    dataset_id: str | None = None,
    results: Mapping[str, float] | None = None,
    training: Mapping[str, object] | None = None,
    base_model: str | None = None,
    num_parameters: int | None = None,
    example_input: str = "",
    example_context: str = "",
) -> ModelCard:
    """Fill the `task` template from `config` and one training run.

    `model_id` is what the usage snippet loads (a local folder or a Hub repo id), `dataset_name` a readable name of
    the training data and `dataset_id` its Hub id (default: `dataset_name`), `results` the measured metrics keyed
    as in `METRICS`, `training` the run's settings shown as a table, `base_model` the checkpoint it was fine-tuned
    from, and `example_input` the text the snippet feeds the model (for question answering, the question, its
    context `example_context`; for multiple choice, the question, its choices `example_context`, joined by " | ").
    """
    results = dict(results or {})
    unknown = sorted(set(results) - set(METRICS))
    if unknown:
        raise ValueError(f"`results` has unknown metrics {unknown}; valid keys are {sorted(METRICS)}.")
    front_matter, body = _split_template(template_text(task))
    name = model_id.rstrip("/").split("/")[-1]
    data = ModelCardData(
        **front_matter,
        model_name=name,
        base_model=base_model,
        datasets=[dataset_id or dataset_name],
        metrics=sorted({METRICS[key][0] for key in results}) or None,
        eval_results=[
            EvalResult(
                task_type=task,
                dataset_type=dataset_id or dataset_name,
                dataset_name=dataset_name,
                metric_type=METRICS[key][0],
                metric_name=METRICS[key][1],
                metric_value=round(float(value), 4),
            )
            for key, value in results.items()
        ]
        or None,
    )
    slots = {
        "model_name": name,
        "model_id": model_id,
        "dataset_name": dataset_name,
        "origin": f"fine-tuned from `{base_model}`" if base_model else "trained from scratch",
        "architecture": _architecture(config, num_parameters),
        "training": _table(("setting", "value"), list((training or {}).items())) or "Not recorded.",
        "results": _table(("metric", "value"), [(METRICS[k][1], f"{v:.4f}") for k, v in results.items()])
        or "Not measured.",
        "labels": ", ".join(f"`{label}`" for label in (config.id2label or {}).values()),
        "example_input": _quoted(example_input),
        "example_context": _quoted(example_context),
        "paper": PAPER,
        "max_new_tokens": min(80, config.max_position_embeddings // 2),
    }
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{string.Template(body).substitute(slots)}")


def write_model_card(output_dir: str | Path, config: TurnerConfig, **kwargs: object) -> Path:
    """Render the card (see `render_model_card`) and save it as `output_dir/README.md`; returns its path."""
    path = Path(output_dir) / CARD_NAME
    render_model_card(config, **kwargs).save(path)
    return path


def retarget_model_card(card: ModelCard, repo_id: str) -> ModelCard:
    """The same card with its usage snippet loading `repo_id` (used when a local folder is pushed to the Hub)."""
    content, count = _MODEL_ID_LINE.subn(f'model_id = "{repo_id}"', card.content)
    if count == 0:
        return card
    return ModelCard(content)


def _quoted(text: str) -> str:
    """`text` as it stands inside a double-quoted Python string of the usage snippet."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _split_template(text: str) -> tuple[dict, str]:
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise ValueError("A model-card template must start with YAML front matter between two '---' lines.")
    return yaml.safe_load(match.group(1)) or {}, text[match.end() :]


def _architecture(config: TurnerConfig, num_parameters: int | None) -> str:
    """The shape in the paper's symbols, then every switch of the config with the ones changed from their defaults
    named: what the card's "Model" section shows."""
    inputs = (
        f"{config.image_size}x{config.image_size} images, {config.patch_size}x{config.patch_size} patches "
        f"({config.num_patches} + class token), {config.num_channels} channels"
        if config.is_image_model
        else f"{config.vocab_size} tokens, up to {config.max_position_embeddings} positions"
    )
    shape = [("inputs", inputs), *((f"{label} (`{name}`)", getattr(config, name)) for name, label in SHAPE.items())]
    if num_parameters is not None:
        shape.append(("parameters", f"{num_parameters:,}"))
    switches = _switches(config)
    changed = [
        f"`{name}`" for name, value, default in switches if name in PAPER_SECTIONS and default not in (None, value)
    ]
    rows = [
        (f"`{name}`", f"`{value}`", "derived" if default is None else f"`{default}`", PAPER_SECTIONS.get(name, ""))
        for name, value, default in switches
    ]
    return "\n\n".join(
        [
            _table(("", "value"), shape),
            f"The paper's switches changed from the standard block: {', '.join(changed) or 'none'}.",
            _table(("switch", "value", "default", "in the paper"), rows),
        ]
    )


def _switches(config: TurnerConfig) -> list[tuple[str, object, object]]:
    """Each choice of the config's own (a field typed `bool` or `Literal`): its name, value and declared default
    (None where it is derived from the other fields)."""
    not_the_models = {"use_cache", "check_input_values"}  # how it runs, not what it computes
    inherited = {field.name for field in dataclasses.fields(PreTrainedConfig)} | not_the_models
    return [
        (field.name, getattr(config, field.name), field.default)
        for field in dataclasses.fields(config)
        if field.name not in inherited and _is_choice(field.type)
    ]


def _is_choice(annotation: object) -> bool:
    kinds = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return all(kind is bool or get_origin(kind) is Literal for kind in kinds if kind is not type(None))


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    if not rows:
        return ""
    lines = [" | ".join(("", *header, "")).strip(), "|" + " --- |" * len(header)]
    lines += [" | ".join(("", *map(str, row), "")).strip() for row in rows]
    return "\n".join(lines)


__all__ = ["TASKS", "render_model_card", "retarget_model_card", "template_text", "write_model_card"]
