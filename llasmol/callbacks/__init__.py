from llasmol.callbacks.checkpoint import AdapterModelCheckpoint, adapter_dir

__all__ = ["AdapterModelCheckpoint", "adapter_dir"]
