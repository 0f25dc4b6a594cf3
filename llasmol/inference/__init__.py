"""Generation and scoring with a trained or base model: checkpoints, beam search, prediction records.

Never imports training code or Lightning: `evaluate` and `generate` run without them.
"""
