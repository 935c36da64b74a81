"""The model-card templates, one Markdown file per task; `turner_tfm.cards` fills them (see README.md here)."""
