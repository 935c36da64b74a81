"""What three or more example scripts share, one module a topic:

- `flags`: the command line: every `TrainingArguments` field, the `TurnerConfig` fields, an arguments file, checks
  that name the flag, the value and what is allowed (no torch: `--help` and a bad flag answer at once);
- `training_fields`: `TrainingArguments`' fields as flags, read from transformers' source without importing it;
- `data`: the built-in corpora and images, tokenizers trained on the spot, text in blocks of tokens;
- `padding_free`: sequences packed in one row per batch, and their collators;
- `resume`: which checkpoint a run resumes from (`--resume_from_checkpoint PATH|true|auto`);
- `callbacks`: the `TrainerCallback`s that keep a checkpoint from counting before every process saved its part;
- `distributed`: several processes without a GPU (gloo), sharding with `--fsdp_size`, naming a lost process;
- `model_card`: the loss curve, the run's summary, and saving with a filled model card.

The scripts import it as `helpers` (it sits beside them); tests, benchmarks and experiments, which run from the
repository root (`python -m benchmarks.NAME`), as `examples.helpers`.
"""
