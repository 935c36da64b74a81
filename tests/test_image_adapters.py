"""The image model follows HF's conventions for adapters: its input embedding is the patch embedding (as ViT's),
so LoRA with gradient checkpointing trains it exactly as without checkpointing."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from turner_tfm import TurnerForImageClassification, TurnerModel

from .tiny import image_config, text_config


def test_input_embeddings_are_the_patch_embedding_and_can_be_replaced():
    model = TurnerForImageClassification(image_config())
    patch_embed = model.model.embeddings.patch_embed
    assert model.get_input_embeddings() is patch_embed and model.model.get_input_embeddings() is patch_embed
    wider = nn.Conv2d(3, 32, kernel_size=4, stride=4)
    model.set_input_embeddings(wider)
    assert model.model.embeddings.patch_embed is wider
    with torch.no_grad():
        patches = wider(torch.ones(1, 3, 16, 16)).flatten(2).transpose(1, 2)
    hidden = model.model(pixel_values=torch.ones(1, 3, 16, 16), output_hidden_states=True).hidden_states[0]
    position = model.model.embeddings.embed_positions.weight[1:]
    torch.testing.assert_close(hidden[0, 1:], patches[0] + position)
    text = TurnerModel(text_config())
    assert text.get_input_embeddings() is text.embeddings.embed_tokens


def lora_gradients(checkpointing: dict | None) -> dict[str, torch.Tensor]:
    """One LoRA step's gradients on the image classifier, with `checkpointing` kwargs (None: no checkpointing)."""
    torch.manual_seed(0)
    model = TurnerForImageClassification(image_config())
    if checkpointing is not None:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["qkv_proj", "o_proj"], modules_to_save=["classifier"])
    model = get_peft_model(model, lora).train()
    pixels = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    model(pixel_values=pixels, labels=torch.tensor([0, 1, 2, 1])).loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_lora_with_gradient_checkpointing_gives_the_same_gradients(use_reentrant):
    plain = lora_gradients(None)
    checkpointed = lora_gradients({"use_reentrant": use_reentrant})
    assert plain.keys() == checkpointed.keys()
    assert sum("lora_B" in name for name in plain) == 2 * 2  # qkv_proj and o_proj in both blocks
    for name, grad in plain.items():
        assert grad is not None and checkpointed[name] is not None, name
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert all(grad.abs().sum() > 0 for name, grad in checkpointed.items() if "lora_B" in name)
