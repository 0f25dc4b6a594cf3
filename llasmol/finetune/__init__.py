"""Training with Lightning: the LoRA module, checkpoints, validation generation, loggers, resume, scale-out."""
