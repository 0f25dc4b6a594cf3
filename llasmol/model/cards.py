"""The model cards (README.md) of an adapter folder and of an exported, merged model: one renderer of the facts a
run saves once at train time (`card.json` in its run directory, gathered by `llasmol.finetune.build.card_facts`).

The facts: base (Hub id), model (`model=` name), tiny (random-weight demo base), lora (name, r, alpha, dropout,
targets, train_head), params (trainable, total, percent), data (each place in words), tasks (trained), own_tasks
(declared task -> family) and recipe (one line). A card carries no path of the machine that wrote it.
"""

from __future__ import annotations

from typing import Optional

CITATION = """@article{yu2024llasmol,
  title={LlaSMol: Advancing Large Language Models for Chemistry with a Large-Scale, Comprehensive,
         High-Quality Instruction Tuning Dataset},
  author={Botao Yu and Frazier N. Baker and Ziqi Chen and Xia Ning and Huan Sun},
  journal={arXiv preprint arXiv:2402.09391},
  year={2024}
}"""


def trained_on(facts: dict) -> str:
    """What the adapter learnt from, in words: SMolInstruct, tasks of its own, or both."""
    own = list(facts.get("own_tasks") or {})
    smolinstruct = any(task not in own for task in facts["tasks"])
    if not own:
        return "SMolInstruct"
    return ("SMolInstruct and " if smolinstruct else "") + f"tasks of its own ({', '.join(own)})"


def training_lines(facts: dict) -> list[str]:
    """The adapter and how it was trained, one fact a line: both cards say them alike."""
    lora, params, own = facts["lora"], facts["params"], facts.get("own_tasks") or {}
    return [
        f"- LoRA `{lora['name']}`: r={lora['r']}, alpha={lora['alpha']}, dropout={lora['dropout']}, on "
        f"{', '.join(lora['targets'])}" + (" and a trained output head" if lora.get("train_head") else ""),
        f"- trainable parameters: {params['trainable']:,} of {params['total']:,} ({params['percent']:.2f}%)",
        f"- data: {facts['data']}; tasks: {', '.join(facts['tasks'])}",
        *(["- tasks of its own (data.new_tasks, scored as their family): "
           + ", ".join(f"{name} ({family})" for name, family in own.items())] if own else []),
        f"- recipe: {facts['recipe']}",
        *([f"- objective: {facts['objective']}"] if facts.get("objective") else []),
    ]


def adapter_card(facts: dict, metrics: dict, step: int) -> str:
    """The README.md of an adapter folder: what it is, how it was trained, how it scored at `step` (`metrics`:
    the latest validation's `val/...` values there), how to load it."""
    front = ["---", "library_name: peft", "tags: [lora, chemistry, llasmol, smolinstruct]"]
    if not facts["tiny"]:
        front += [f"base_model: {facts['base']}", "datasets: [osunlp/SMolInstruct]"]
    lines = front + ["---", "", f"# {facts['model']} + LoRA `{facts['lora']['name']}` on {trained_on(facts)}", ""]
    if facts["tiny"]:
        lines += ["The base is llasmol's embedded **tiny model**: 2 layers with **random weights**, rebuilt by llasmol",
                  "from `model.init_seed` (never saved), trained on the bundled excerpt of the data. It is a demo",
                  "of the pipeline, not a chemistry model; load it with llasmol (`model=tiny`).", ""]
    else:
        lines += [f"LoRA adapter for `{facts['base']}`, trained with llasmol as in the LlaSMol paper.", ""]
    lines += ["## Adapter and training", "", *training_lines(facts), f"- this checkpoint: optimizer step {step}", ""]
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)}
    if scores:
        lines += ["## Validation at this step", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in sorted(scores.items())] + [""]
    lines += [
        "## Use", "",
        "With llasmol (the paper's prompt `<s>[INST] {query} [/INST]`, beams and metrics):", "", "```bash",
        f"python -m llasmol.evaluate ckpt=<this folder> model={facts['model']} data.split=test",
        f'python -m llasmol.generate "<your question>" ckpt=<this folder> model={facts["model"]}', "```", "",
    ]
    if not facts["tiny"]:
        lines += ["With PEFT:", "", "```python", "from peft import PeftModel",
                  "from transformers import AutoModelForCausalLM, AutoTokenizer",
                  f'base = AutoModelForCausalLM.from_pretrained("{facts["base"]}", torch_dtype="bfloat16")',
                  'model = PeftModel.from_pretrained(base, "<this folder>")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{facts["base"]}")', "```", ""]
    return "\n".join(lines + ["## Citation", "", "```bibtex", CITATION, "```", ""])


def merged_card(model_cfg, facts: Optional[dict], adapter: str, decoding: str, evaluation: list[str]) -> str:
    """The README.md of an exported model: `model_cfg` its base's config, `facts` the run's (None for an adapter
    folder, or a run from before runs kept them), `adapter` the adapter's name within its run (no machine path),
    `decoding` the beams per task, `evaluation` the test metrics' lines or how to get them."""
    base = model_cfg.get("hf_id") or model_cfg.name
    about = facts if facts is not None else {"tasks": []}
    demo = ", random initial weights: a demo, not a chemistry model" if model_cfg.get("random_init") else ""
    lines = [
        "---", "library_name: transformers", "tags: [chemistry, llasmol, smolinstruct, lora-merged]",
        *([f"base_model: {base}"] if model_cfg.get("hf_id") else []), "---", "",
        f"# {model_cfg.name} + LlaSMol adapter, merged", "",
        f"A causal LM fine-tuned with LoRA on {trained_on(about)} (SMolInstruct: Yu et al. 2024, arXiv 2402.09391) by "
        "llasmol, the adapter merged into its base: it loads with `AutoModelForCausalLM.from_pretrained` and needs "
        "no PEFT.", "",
        f"- base: `{base}` ({model_cfg.dtype}{demo})", f"- adapter: `{adapter}`",
        *(training_lines(facts) if facts is not None else []),
        f"- prompt: `{model_cfg.get('prompt_template')}`; answers between tags such as `<SMILES> … </SMILES>`", "",
        "## Decoding", "", decoding, "", "## Evaluation", "", *evaluation, "",
        "## Citation", "", "```bibtex", CITATION, "```", "",
    ]
    return "\n".join(lines)
