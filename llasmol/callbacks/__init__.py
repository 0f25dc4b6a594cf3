from llasmol.callbacks.checkpoint import AdapterModelCheckpoint, adapter_dir
from llasmol.callbacks.generation import GenerationEvaluator

__all__ = ["AdapterModelCheckpoint", "GenerationEvaluator", "adapter_dir"]
