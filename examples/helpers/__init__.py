"""What several example scripts share, one module a topic; scripts, tests, benchmarks and experiments all import it
as `examples.helpers` (run the scripts from the repository root: `python -m examples.NAME`).

- `training`: the training scripts' arguments (`HfArgumentParser`, the `TurnerConfig` fields as flags) and their run
  around their own `Trainer` (resume, process watch, loss curve, the process group left at the end);
- `argtypes`: argparse value types for the scripts that train nothing;
- `data`: the built-in corpora and images, tokenizers trained on the spot, text in blocks of tokens;
- `padding_free`: sequences packed in one row per batch, and their collators;
- `resume`: which checkpoint a run resumes from (`--resume_from_checkpoint PATH|true|auto`);
- `callbacks`: the `TrainerCallback`s that keep a checkpoint from counting before every process saved its part;
- `distributed`: several processes without a GPU (gloo), sharding with `fsdp_size`, naming a lost process;
- `model_card`: the loss curve, the run's summary, and saving with a filled model card.
"""
