"""Pictures of what a Turner model attends to: attention maps per layer and head, for text and for images.

Matplotlib is an optional extra (`pip install turner-tfm[plot]`); it is imported only when a function here runs.
Every function returns a `matplotlib.figure.Figure` built without pyplot (no GUI, no global state) and saves it as
a PNG when given a `path`.

Maps are drawn the paper's way round (eq. 1-2, footnote 6): column n holds the weights A_{n',n} with which output
token n averages the input tokens n', so each column sums to 1 and the auto-regressive mask of §4.1 leaves the map
upper triangular. The weights need the eager attention, the only implementation that returns them: load or build
the model with `attn_implementation="eager"`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch

if TYPE_CHECKING:
    from typing import Unpack

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from transformers import PreTrainedModel

_INSTALL_HINT = "turner_tfm.plotting needs matplotlib: pip install 'turner-tfm[plot]'"
_VISIBLE_WHITESPACE = {" ": "\u2423", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _figure_class() -> type[Figure]:
    """`matplotlib.figure.Figure`, imported on first use, or an ImportError that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return Figure


def _check_eager(model: PreTrainedModel) -> None:
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != "eager":
        raise ValueError(
            f"`model` runs attention with attn_implementation={implementation!r}, which does not return the attention "
            "weights; build or load it with attn_implementation='eager' "
            "(e.g. AutoModelForCausalLM.from_pretrained(path, attn_implementation='eager'))."
        )


def _check_modality(model: PreTrainedModel, image: bool) -> None:
    if bool(getattr(model.config, "is_image_model", False)) != image:
        wanted = "an image model (config.image_size set)" if image else "a text model (config.image_size None)"
        raise ValueError(f"`model` must be {wanted}; got image_size={getattr(model.config, 'image_size', None)!r}.")


def attention_weights(model: PreTrainedModel, **inputs: Any) -> list[torch.Tensor]:
    """Run `model` on one example and return, per layer, its attention weights as a (heads, N, N) float tensor.

    Entry [h, n, n'] is A_h[n', n] of eq. 5: how much output token n takes from input token n' (rows sum to 1).
    The model runs in eval mode without gradients (dropout off, BatchNorm statistics untouched) and is put back
    in the mode it was in.
    """
    _check_eager(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = model(**inputs, output_attentions=True)
    finally:
        model.train(was_training)
    if not outputs.attentions:
        raise ValueError(f"`model` ({type(model).__name__}) returned no attention weights.")
    return [layer[0].detach().float().cpu() for layer in outputs.attentions]


def _pick(name: str, chosen: Sequence[int] | None, count: int) -> list[int]:
    """The layers or heads to draw: all of them by default; an index out of range is a ValueError."""
    picked = list(range(count)) if chosen is None else list(chosen)
    if not picked or any(not isinstance(i, int) or not 0 <= i < count for i in picked):
        raise ValueError(f"`{name}` {chosen!r} is invalid: expected a non-empty list of indices in [0, {count}).")
    return picked


def _check_maps(attentions: Sequence[torch.Tensor]) -> tuple[int, int]:
    """Every layer's weights must be (heads, N, N) with the same heads and N; returns (heads, N)."""
    if not attentions:
        raise ValueError("`attentions` is empty: expected one (heads, N, N) tensor per layer.")
    shape = tuple(attentions[0].shape)
    for layer, weights in enumerate(attentions):
        if weights.ndim != 3 or weights.shape[1] != weights.shape[2] or tuple(weights.shape) != shape:
            raise ValueError(
                f"`attentions[{layer}]` has shape {tuple(weights.shape)}: expected (heads, N, N), the same for "
                f"every layer (layer 0 is {shape})."
            )
    return shape[0], shape[1]


def _label(token: str) -> str:
    return "".join(_VISIBLE_WHITESPACE.get(char, char) for char in token)


def _grid(rows: int, columns: int, panel_inches: float, title: str | None) -> tuple[Figure, list[list[Axes]]]:
    figure = _figure_class()(figsize=(columns * panel_inches + 1.2, rows * panel_inches + 0.8), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    if title:
        figure.suptitle(title)
    return figure, [list(row) for row in axes]


def _save(figure: Figure, path: str | os.PathLike | None) -> None:
    if path is not None:
        figure.savefig(path, dpi=110)


def plot_attention_maps(
    attentions: Sequence[torch.Tensor],
    tokens: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Heatmaps of attention weights, one panel per layer (rows) and head (columns), with `tokens` on both axes.

    `attentions` is what `attention_weights` returns: per layer a (heads, N, N) tensor. Each panel is the paper's
    A_h (eq. 5, footnote 6): output token n across, input token n' down, so columns sum to 1.
    """
    num_heads, length = _check_maps(attentions)
    if len(tokens) != length:
        raise ValueError(f"`tokens` has {len(tokens)} entries but the attention maps cover {length} tokens.")
    layers, heads = _pick("layers", layers, len(attentions)), _pick("heads", heads, num_heads)
    figure, axes = _grid(len(layers), len(heads), max(2.2, 0.16 * length + 0.8), title)
    labels = [_label(str(token)) for token in tokens]
    fontsize = max(4.0, min(9.0, 220 / max(length, 1)))
    image = None
    for row, layer in zip(axes, layers, strict=True):
        for ax, head in zip(row, heads, strict=True):
            image = ax.imshow(attentions[layer][head].T.numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(length), labels, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(length), labels, fontsize=fontsize)
        row[0].set_ylabel("input token n'")
    for ax in axes[-1]:
        ax.set_xlabel("output token n")
    figure.colorbar(image, ax=[ax for row in axes for ax in row], shrink=0.6, label="A[n', n]")
    _save(figure, path)
    return figure


class MapOptions(TypedDict, total=False):
    """The keyword arguments of `plot_attention_maps` that `plot_text_attention` passes on."""

    layers: Sequence[int] | None
    heads: Sequence[int] | None
    title: str | None
    path: str | os.PathLike | None


def plot_text_attention(
    model: PreTrainedModel, input_ids: torch.Tensor, tokens: Sequence[str], **options: Unpack[MapOptions]
) -> Figure:
    """Run a text model (eager attention) on one sequence and draw its attention per layer and head.

    `input_ids` is (N,) or (1, N); `tokens` are the N strings to write on the axes (e.g.
    `tokenizer.convert_ids_to_tokens(input_ids)`); `layers`, `heads`, `title` and `path` are
    `plot_attention_maps`'s.
    """
    _check_modality(model, image=False)
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"`input_ids` has shape {tuple(input_ids.shape)}: expected one sequence, (N,) or (1, N).")
    if len(tokens) != input_ids.shape[1]:
        raise ValueError(f"`tokens` has {len(tokens)} entries but `input_ids` has {input_ids.shape[1]} tokens.")
    _check_eager(model)
    attentions = attention_weights(model, input_ids=input_ids.to(model.device))
    return plot_attention_maps(attentions, tokens, **options)


def _display_image(image: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """The picture under the overlay, as (height, width, channels) floats in [0, 1]: `image` if given (a PIL image
    or an array), else the model input rescaled to [0, 1]."""
    if image is None:
        pixels = pixel_values.float().permute(1, 2, 0)
    else:
        pixels = torch.from_numpy(np.array(image, dtype=np.float32))
        pixels = pixels.unsqueeze(-1) if pixels.ndim == 2 else pixels
        if pixels.ndim != 3:
            raise ValueError(f"`image` has shape {tuple(pixels.shape)}: expected (height, width[, channels]).")
    pixels = pixels - pixels.min()
    return pixels / pixels.max().clamp(min=1e-12)


def plot_image_attention(
    model: PreTrainedModel,
    pixel_values: torch.Tensor,
    *,
    image: Any = None,
    query: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    alpha: float = 0.8,
    title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """The class token's attention over the patches (§4.2), per layer (rows) and head (columns, then their mean),
    laid over the image.

    The attention row of the query token is reshaped to the patch grid, upsampled to the image's size and drawn
    over `image` (the picture the user sees; default: `pixel_values` rescaled), more opaque where the attention is
    higher, up to `alpha`; one colour scale serves every panel. `query`
    defaults to the token the classifier reads: the class token x_0, or the last patch when
    `classifier_pooling="last"` (under the causal mask the class token sees only itself).
    """
    _check_modality(model, image=True)
    pixel_values = torch.as_tensor(pixel_values)
    if pixel_values.ndim == 3:
        pixel_values = pixel_values.unsqueeze(0)
    if pixel_values.ndim != 4 or pixel_values.shape[0] != 1:
        raise ValueError(
            f"`pixel_values` has shape {tuple(pixel_values.shape)}: expected one image, (C, H, W) or (1, C, H, W)."
        )
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"`alpha` {alpha} is invalid: expected a number in [0, 1].")
    patch = model.config.patch_size
    grid = (pixel_values.shape[2] // patch, pixel_values.shape[3] // patch)
    num_tokens = grid[0] * grid[1] + 1
    if query is None:
        query = num_tokens - 1 if getattr(model.config, "classifier_pooling", "cls") == "last" else 0
    if not isinstance(query, int) or not 0 <= query < num_tokens:
        raise ValueError(f"`query` {query!r} is invalid: expected a token index in [0, {num_tokens}).")
    _check_eager(model)
    attentions = attention_weights(model, pixel_values=pixel_values.to(model.device, model.dtype))
    num_heads, _ = _check_maps(attentions)
    layers, heads = _pick("layers", layers, len(attentions)), _pick("heads", heads, num_heads)
    picture = _display_image(image, pixel_values[0])
    height, width = picture.shape[:2]

    def overlay(weights: torch.Tensor) -> torch.Tensor:
        """Attention over the patches (the class token's own weight left out), as an image-sized map."""
        patch_map = weights[query, 1:].reshape(1, 1, *grid)
        return torch.nn.functional.interpolate(patch_map, size=(height, width), mode="nearest")[0, 0]

    maps = [[overlay(attentions[layer][head]) for head in heads] for layer in layers]
    maps = [[*row, torch.stack(row).mean(dim=0)] for row in maps]
    low = min(float(m.min()) for row in maps for m in row)
    high = max(low + 1e-6, max(float(m.max()) for row in maps for m in row))
    who = "class token" if query == 0 else f"token {query}"
    heading = f"attention of the {who} over the patches"
    figure, axes = _grid(len(layers), len(heads) + 1, 2.2, f"{title}\n{heading}" if title else heading)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    colours = ScalarMappable(Normalize(low, high), "inferno")
    extent = (0, width, height, 0)
    shown = picture.squeeze(-1).numpy() if picture.shape[-1] == 1 else picture.numpy()
    for row, layer, row_maps in zip(axes, layers, maps, strict=True):
        for ax, name, weights in zip(row, [*(f"head {h}" for h in heads), "mean of heads"], row_maps, strict=True):
            ax.imshow(shown, cmap="gray", extent=extent)
            opacity = (alpha * (weights - low) / (high - low)).clamp(0.0, 1.0).numpy()
            ax.imshow(weights.numpy(), cmap=colours.cmap, norm=colours.norm, alpha=opacity, extent=extent)
            ax.set_title(f"layer {layer}, {name}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    figure.colorbar(colours, ax=[ax for row in axes for ax in row], shrink=0.6, label=f"attention of the {who}")
    _save(figure, path)
    return figure


__all__ = ["attention_weights", "plot_attention_maps", "plot_image_attention", "plot_text_attention"]
