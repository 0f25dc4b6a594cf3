"""Generation and scoring with a trained or base model: checkpoints, beam search, the evaluation pipeline
(`pipeline.py`) and the predictions files it writes (`predictions.py`).

Never imports training code or Lightning: `evaluate` and `generate` run without them.
"""
