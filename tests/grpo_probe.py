"""The GRPO sampler with crafted answers: usable as a pytest fixture and, in a process of its own, as a callback."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

# Answers the random tiny model never gives: in each group the first completion is a molecule in its tags, the
# second a number in its tags, the rest sampled, so rewards differ within groups (the scorer reads them all).
CRAFTED = ("<SMILES> CCO </SMILES>", "<NUMBER> -1.5 </NUMBER>")


def crafted_sampler(tokenizer):
    """`grpo.sample_group` with its first two completions of each group replaced by `CRAFTED` (the sampler
    otherwise as it is: the same seeds, masks and lengths)."""
    import torch

    from llasmol.finetune import grpo

    def sample(model, prompt_ids, prompt_mask, num_generations, max_new_tokens, *args, **kwargs):
        completion, _ = grpo.sample_group(model, prompt_ids, prompt_mask, num_generations, max_new_tokens, *args,
                                          **kwargs)
        eos = args[3]  # (temperature, top_p, seed, eos_id, pad_id)
        for row in range(completion.size(0)):
            if row % num_generations < len(CRAFTED):
                ids = tokenizer(CRAFTED[row % num_generations], add_special_tokens=False).input_ids + [eos]
                ids = ids[: completion.size(1)]
                completion[row] = eos
                completion[row, : len(ids)] = torch.tensor(ids)
        return completion, grpo.completion_mask(completion, eos)

    return sample


class CraftedRollouts(Callback):
    """Installs `crafted_sampler` in this process (each rank of a multi-process run) before training starts."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        from llasmol.finetune import rollouts

        rollouts.sample_group = crafted_sampler(pl_module.tokenizer)
