"""trust_remote_code: a saved folder carries its own code and loads in a process that cannot import turner_tfm."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification

from .tiny import image_config, random_ids, text_config

# Runs in a fresh interpreter, outside the repository, with `import turner_tfm` made impossible.
LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["turner_tfm"] = None
    import torch, transformers
    folder, auto_name, inputs_file, outputs_file, threads = sys.argv[1:6]
    torch.set_num_threads(int(threads))  # the parent's: bitwise equality needs the same reduction order
    try:
        import turner_tfm  # noqa: F401
        raise SystemExit("turner_tfm should not be importable here")
    except ImportError:
        pass
    model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    with torch.no_grad():
        logits = model(**torch.load(inputs_file)).logits
    torch.save(logits, outputs_file)
    """
)


@pytest.mark.parametrize(
    ("model_class", "auto_name", "config", "inputs"),
    [
        (TurnerForCausalLM, "AutoModelForCausalLM", text_config(), {"input_ids": random_ids(2, 6)}),
        (
            TurnerForSequenceClassification,
            "AutoModelForSequenceClassification",
            text_config(is_causal=False, norm_position="post", type_vocab_size=2, embedding_layer_norm=True),
            {"input_ids": random_ids(2, 6)},
        ),
        (
            TurnerForImageClassification,
            "AutoModelForImageClassification",
            image_config(),
            {"pixel_values": torch.randn(2, 3, 16, 16)},
        ),
    ],
)
def test_saved_folder_loads_without_the_package(model_class, auto_name, config, inputs, tmp_path):
    model = model_class(config).eval()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    assert {"modeling_turner.py", "configuration_turner.py", "model.safetensors"} <= {p.name for p in folder.iterdir()}
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoConfig"] == "configuration_turner.TurnerConfig"
    assert auto_map[auto_name] == f"modeling_turner.{model_class.__name__}"

    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            str(script),
            str(folder),
            auto_name,
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "out.pt"),
            str(torch.get_num_threads()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        expected = model(**inputs).logits
    # identical to float noise (1e-6): a freshly loaded tensor's memory alignment may pick another kernel path
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, rtol=1e-6, atol=1e-7)
