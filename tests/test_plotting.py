"""turner_tfm.plotting and examples/plot_attention.py: the right panels, readable PNGs, clear errors on bad input."""

import runpy
import sys
from pathlib import Path

import matplotlib  # noqa: F401  (the dev extra: a missing or broken install fails here, it never skips)
import pytest
import torch
from PIL import Image

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification
from turner_tfm.plotting import attention_weights, plot_attention_maps, plot_image_attention, plot_text_attention

from .tiny import image_config, random_ids, text_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LAYERS, HEADS = 2, 4  # the tiny configs


def panels(figure) -> int:
    """Axes that show a picture (the colour bar's axes do not count)."""
    return sum(1 for ax in figure.axes if ax.images)


def png_size(path: Path) -> tuple[int, int]:
    assert path.stat().st_size > 5_000, "the PNG is suspiciously small"
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def text_model(**overrides) -> TurnerForCausalLM:
    return TurnerForCausalLM(text_config(attn_implementation="eager", **overrides)).eval()


def image_model(**overrides) -> TurnerForImageClassification:
    return TurnerForImageClassification(image_config(attn_implementation="eager", **overrides)).eval()


def test_attention_weights_are_per_layer_heads_by_tokens_with_rows_summing_to_one():
    weights = attention_weights(text_model(), input_ids=random_ids(1, 6))
    assert len(weights) == LAYERS
    assert all(w.shape == (HEADS, 6, 6) for w in weights)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(HEADS, 6))
    assert torch.all(weights[1].triu(diagonal=1) == 0), "the causal mask: no token attends to a later one"


def test_text_attention_has_a_panel_per_layer_and_head_and_saves_a_png(tmp_path):
    path = tmp_path / "text.png"
    figure = plot_text_attention(text_model(), random_ids(1, 7)[0], list("abc def"), path=path)
    assert panels(figure) == LAYERS * HEADS
    width, height = png_size(path)
    assert width > 600 and height > 300


def test_text_attention_draws_the_chosen_layers_and_heads(tmp_path):
    figure = plot_text_attention(text_model(), random_ids(1, 5), list("abcde"), layers=[1], heads=[0, 3])
    assert panels(figure) == 2
    titles = sorted(ax.get_title() for ax in figure.axes if ax.images)
    assert titles == ["layer 1, head 0", "layer 1, head 3"]


def test_training_mode_is_restored_and_batchnorm_statistics_untouched():
    model = text_model(normalization="batchnorm").train()
    before = model.model.layers[0].attn_norm.running_mean.clone()
    plot_text_attention(model, random_ids(1, 5), list("abcde"))
    assert model.training
    assert torch.equal(model.model.layers[0].attn_norm.running_mean, before)


def test_image_attention_overlays_every_head_and_their_mean(tmp_path):
    path = tmp_path / "image.png"
    picture = (torch.rand(20, 20, 3) * 255).to(torch.uint8).numpy()  # shown at its own size, 20x20
    figure = plot_image_attention(image_model(), torch.randn(3, 16, 16), image=picture, path=path)
    assert panels(figure) == LAYERS * (HEADS + 1)
    overlay = next(ax for ax in figure.axes if ax.images).images[1].get_array()
    assert overlay.shape == (20, 20), "the 4x4 patch grid is upsampled to the picture's size"
    width, height = png_size(path)
    assert width > 600 and height > 300


def test_image_attention_reads_the_last_token_of_a_causal_last_pooling_classifier():
    model = image_model(is_causal=True, classifier_pooling="last")
    figure = plot_image_attention(model, torch.randn(1, 3, 16, 16), layers=[0], heads=[0])
    assert panels(figure) == 2
    assert f"token {model.config.num_patches}" in figure.get_suptitle()
    assert float(figure.axes[0].images[1].get_array().max()) > 0, "the last token sees every patch"


def test_a_model_without_eager_attention_is_refused():
    model = TurnerForCausalLM(text_config(attn_implementation="sdpa"))
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        plot_text_attention(model, random_ids(1, 4), list("abcd"))
    image = TurnerForImageClassification(image_config(attn_implementation="sdpa"))
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        plot_image_attention(image, torch.randn(3, 16, 16))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, i: plot_text_attention(m, random_ids(1, 4), list("abc")), "`tokens` has 3 entries"),
        (lambda m, i: plot_text_attention(m, random_ids(2, 4), list("abcd")), "expected one sequence"),
        (lambda m, i: plot_text_attention(m, random_ids(1, 4), list("abcd"), layers=[2]), "`layers`"),
        (lambda m, i: plot_text_attention(m, random_ids(1, 4), list("abcd"), heads=[]), "`heads`"),
        (lambda m, i: plot_text_attention(i, random_ids(1, 4), list("abcd")), "must be a text model"),
        (lambda m, i: plot_image_attention(m, torch.randn(3, 16, 16)), "must be an image model"),
        (lambda m, i: plot_image_attention(i, torch.randn(2, 3, 16, 16)), "expected one image"),
        (lambda m, i: plot_image_attention(i, torch.randn(3, 16, 16), query=17), "`query` 17"),
        (lambda m, i: plot_image_attention(i, torch.randn(3, 16, 16), alpha=2.0), "`alpha` 2.0"),
        (lambda m, i: plot_attention_maps([torch.rand(2, 3, 3)], list("abcd")), "`tokens` has 4 entries"),
        (lambda m, i: plot_attention_maps([torch.rand(2, 3, 4)], list("abc")), r"expected \(heads, N, N\)"),
        (lambda m, i: plot_attention_maps([], []), "`attentions` is empty"),
    ],
)
def test_bad_input_is_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(text_model(), image_model())


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes `import matplotlib.figure` fail
    with pytest.raises(ImportError, match=r"pip install 'turner-tfm\[plot\]'"):
        plot_attention_maps([torch.rand(1, 2, 2)], ["a", "b"])


def run_plot_attention(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / "plot_attention.py"), *args])
    try:
        runpy.run_path(str(EXAMPLES / "plot_attention.py"), run_name="__main__")
    except SystemExit as done:  # `sys.exit(main())`: a success exits with None
        if done.code not in (None, 0):
            raise


def test_example_script_draws_a_saved_language_model_with_its_tokenizer(tmp_path, monkeypatch, capsys):
    from examples.helpers import data

    tokenizer = data.char_tokenizer(["Return the sum."], model_max_length=64)
    TurnerForCausalLM(text_config(vocab_size=len(tokenizer))).save_pretrained(tmp_path / "lm")  # saved with sdpa
    tokenizer.save_pretrained(tmp_path / "lm")
    out = tmp_path / "text.png"
    run_plot_attention(monkeypatch, "text", "--model", str(tmp_path / "lm"), "--text", "sum", "--output", str(out))
    assert f"wrote {out}: {LAYERS * HEADS} panels" in capsys.readouterr().out
    png_size(out)


def test_example_script_draws_a_fresh_image_classifier_on_a_digit(tmp_path, monkeypatch, capsys):
    out = tmp_path / "image.png"
    run_plot_attention(monkeypatch, "image", "--digit", "3", "--heads", "1", "--output", str(out))
    assert f"wrote {out}: {2 * 2} panels" in capsys.readouterr().out  # 2 layers x (head 1 + mean)
    png_size(out)


def test_example_script_draws_a_saved_image_classifier_on_an_image_file(tmp_path, monkeypatch, capsys):
    from transformers import ViTImageProcessorPil

    folder = tmp_path / "classifier"
    TurnerForImageClassification(image_config()).save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    picture = tmp_path / "picture.png"
    Image.fromarray((torch.rand(40, 30, 3) * 255).to(torch.uint8).numpy()).save(picture)
    out = tmp_path / "image.png"
    run_plot_attention(monkeypatch, "image", "--model", str(folder), "--image", str(picture), "--output", str(out))
    assert f"wrote {out}: {LAYERS * (HEADS + 1)} panels" in capsys.readouterr().out
    png_size(out)


def test_example_script_reports_a_bad_layer_as_a_usage_error(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_plot_attention(monkeypatch, "text", "--layers", "5", "--output", str(tmp_path / "x.png"))
    assert exit_info.value.code == 2
    assert "`layers` [5] is invalid" in capsys.readouterr().err
