"""The model cards (README.md) of an adapter folder and of an exported, merged model: one renderer of the facts a
run saves once at train time (`card.json` in its run directory, gathered by `llasmol.finetune.build.card_facts`).

The facts: base (Hub id), model (`model=` name), tiny (random-weight demo base), demo (the demo base, pretrained or
random; absent from runs before it was pretrained, where it is `tiny`), lora (name, r, alpha, dropout,
targets, train_head), params (trainable, total, percent), data (each place in words), tasks (trained), own_tasks
(declared task -> family) and recipe (one line). A card carries no path of the machine that wrote it.
"""

from __future__ import annotations

import html
from typing import Optional

CITATION = """@article{yu2024llasmol,
  title={LlaSMol: Advancing Large Language Models for Chemistry with a Large-Scale, Comprehensive,
         High-Quality Instruction Tuning Dataset},
  author={Botao Yu and Frazier N. Baker and Ziqi Chen and Xia Ning and Huan Sun},
  journal={arXiv preprint arXiv:2402.09391},
  year={2024}
}"""


def _text(value) -> str:
    """A run's own words (a model or task name, the data in words, the recipe) as card text: markup in them is
    shown, never rendered (the Hub renders a card's HTML), and they stay on their line."""
    return html.escape(" ".join(str(value).split()), quote=False)


def _code(value) -> str:
    """A run's own words inside a code span, a code block or the YAML header: on one line, and with no backtick
    to end the span."""
    return " ".join(str(value).split()).replace("`", "'")


def trained_on(facts: dict) -> str:
    """What the adapter learnt from, in words: SMolInstruct, tasks of its own, or both."""
    own = list(facts.get("own_tasks") or {})
    smolinstruct = any(task not in own for task in facts["tasks"])
    if not own:
        return "SMolInstruct"
    return ("SMolInstruct and " if smolinstruct else "") + f"tasks of its own ({', '.join(map(_text, own))})"


def training_lines(facts: dict) -> list[str]:
    """The adapter and how it was trained, one fact a line: both cards say them alike."""
    lora, params, own = facts["lora"], facts["params"], facts.get("own_tasks") or {}
    return [
        f"- LoRA `{_code(lora['name'])}`: r={lora['r']}, alpha={lora['alpha']}, dropout={lora['dropout']}, on "
        f"{', '.join(map(_text, lora['targets']))}" + (" and a trained output head" if lora.get("train_head") else ""),
        f"- trainable parameters: {params['trainable']:,} of {params['total']:,} ({params['percent']:.2f}%)",
        f"- data: {_text(facts['data'])}; tasks: {', '.join(map(_text, facts['tasks']))}",
        *(["- tasks of its own (data.new_tasks, scored as their family): "
           + ", ".join(f"{_text(name)} ({_text(family)})" for name, family in own.items())] if own else []),
        f"- recipe: {_text(facts['recipe'])}",
        *([f"- objective: {_text(facts['objective'])}"] if facts.get("objective") else []),
    ]


def adapter_card(facts: dict, metrics: dict, step: int) -> str:
    """The README.md of an adapter folder: what it is, how it was trained, how it scored at `step` (`metrics`:
    the latest validation's `val/...` values there), how to load it."""
    front = ["---", "library_name: peft", "tags: [lora, chemistry, llasmol, smolinstruct]"]
    demo = facts.get("demo", facts["tiny"])
    if not demo:
        front += [f"base_model: {_code(facts['base'])}", "datasets: [osunlp/SMolInstruct]"]
    lines = front + ["---", "", f"# {_text(facts['model'])} + LoRA `{_code(facts['lora']['name'])}` on "
                     f"{trained_on(facts)}", ""]
    if facts["tiny"]:
        lines += ["The base is llasmol's embedded **tiny model**: 2 layers with **random weights**, rebuilt by llasmol",
                  "from `model.init_seed` (never saved), trained on the bundled excerpt of the data. It is a demo",
                  "of the pipeline, not a chemistry model; load it with llasmol (`model=tiny model.random_init=true`).",
                  ""]
    elif demo:
        lines += ["The base is llasmol's **demo base**: 2 layers (0.8M parameters) pretrained by llasmol on RDKit facts",
                  "about the bundled training split's molecules (`llasmol/model/demo_base/README.md`), trained here on",
                  "the bundled excerpt of the data. It is a demo that learns some chemistry (formulas), not a chemistry",
                  "model for real use; load it with llasmol (`model=tiny`).", ""]
    else:
        lines += [f"LoRA adapter for `{_code(facts['base'])}`, trained with llasmol as in the LlaSMol paper.", ""]
    lines += ["## Adapter and training", "", *training_lines(facts), f"- this checkpoint: optimizer step {step}", ""]
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)}
    if scores:
        lines += ["## Validation at this step", "", "| metric | value |", "|---|---|"]
        lines += [f"| {_text(k).replace('|', '&#124;')} | {v:.4f} |" for k, v in sorted(scores.items())] + [""]
    lines += [
        "## Use", "",
        "With llasmol (the paper's prompt `<s>[INST] {query} [/INST]`, beams and metrics):", "", "```bash",
        f"python -m llasmol.evaluate ckpt=<this folder> model={_code(facts['model'])} data.split=test",
        f'python -m llasmol.generate "<your question>" ckpt=<this folder> model={_code(facts["model"])}', "```", "",
    ]
    if not demo:
        lines += ["With PEFT:", "", "```python", "from peft import PeftModel",
                  "from transformers import AutoModelForCausalLM, AutoTokenizer",
                  f'base = AutoModelForCausalLM.from_pretrained("{_code(facts["base"])}", torch_dtype="bfloat16")',
                  'model = PeftModel.from_pretrained(base, "<this folder>")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{_code(facts["base"])}")', "```", ""]
    return "\n".join(lines + ["## Citation", "", "```bibtex", CITATION, "```", ""])


def merged_card(model_cfg, facts: Optional[dict], adapter: str, decoding: str, evaluation: list[str]) -> str:
    """The README.md of an exported model: `model_cfg` its base's config, `facts` the run's (None for an adapter
    folder, or a run from before runs kept them), `adapter` the adapter's name within its run (no machine path),
    `decoding` the beams per task, `evaluation` the test metrics' lines or how to get them."""
    base = _code(model_cfg.get("hf_id") or model_cfg.name)
    about = facts if facts is not None else {"tasks": []}
    demo = (", random initial weights: a demo, not a chemistry model" if model_cfg.get("random_init") else
            ", the demo base pretrained by llasmol on RDKit facts: a demo, not a chemistry model"
            if model_cfg.get("tokenizer") == "tiny" else "")
    lines = [
        "---", "library_name: transformers", "tags: [chemistry, llasmol, smolinstruct, lora-merged]",
        *([f"base_model: {base}"] if model_cfg.get("hf_id") else []), "---", "",
        f"# {_text(model_cfg.name)} + LlaSMol adapter, merged", "",
        f"A causal LM fine-tuned with LoRA on {trained_on(about)} (SMolInstruct: Yu et al. 2024, arXiv 2402.09391) by "
        "llasmol, the adapter merged into its base: it loads with `AutoModelForCausalLM.from_pretrained` and needs "
        "no PEFT.", "",
        f"- base: `{base}` ({model_cfg.dtype}{demo})", f"- adapter: `{_code(adapter)}`",
        *(training_lines(facts) if facts is not None else []),
        f"- prompt: `{_code(model_cfg.get('prompt_template'))}`; answers between tags such as `<SMILES> … </SMILES>`", "",
        "## Decoding", "", decoding, "", "## Evaluation", "", *evaluation, "",
        "## Citation", "", "```bibtex", CITATION, "```", "",
    ]
    return "\n".join(lines)
