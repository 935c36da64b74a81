"""Converters between Turner and GPT-2, ViT and BERT, number for number and both ways.

Each family module (`convert.gpt2`, `convert.vit`, `convert.bert`) offers pure weight maps,

    state_dict, turner_config = to_turner(state_dict, config, "GPT2LMHeadModel")
    state_dict, gpt2_config = from_turner(state_dict, turner_config, "GPT2LMHeadModel")

and its `CONVERTER` converts loaded models (`model_to_turner(model)`, `model_from_turner(model, architecture)`).
Whatever the other side cannot express raises ValueError naming the option and its value. The command line is
`python -m convert {gpt2,vit,bert} SRC OUT [--reverse]` in a clone; see `python -m convert --help`. The wheel installs
this folder as `turner_tfm.convert`, with the command `turner-convert` (or `python -m turner_tfm.convert`).
"""
