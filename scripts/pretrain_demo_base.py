#!/usr/bin/env python
"""Pretrain the demo base (llasmol/model/demo_base/): the tiny model's whole weights, on facts RDKit computes for
the molecules of the bundled training split. Seeded, CPU only, offline.

    python scripts/pretrain_demo_base.py                      # the shipped base (about 90 minutes on 2 cores)
    python scripts/pretrain_demo_base.py --steps 3 --molecules 50 --tasks name_conversion-s2f --out /tmp/base

The corpus, written nowhere but hashed (its documents in order, SHA-256) and counted in the card:

- molecules: every molecule (each '.'-separated part) of the bundled *train* split, inputs and outputs, and the
  structures OPSIN gives for its IUPAC names; then new molecules assembled at random from the BRICS fragments of
  those (RDKit's BRICS bond rules, Degen et al. 2008), up to `--molecules` in all;
- excluded: every molecule of the bundled dev and test splits, by connectivity (the first block of the InChIKey,
  so a stereoisomer of a held-out molecule goes too), including the structures of their IUPAC names;
- one document a molecule: its canonical Kekule SMILES as SMolInstruct writes it (`llasmol.core.smiles`), or a
  random spelling beside it, then in a random order its molecular formula and a few numbers RDKit computes
  (weight, Crippen logP, TPSA, donors, acceptors, rings, ...), in SMolInstruct's tags; a training molecule with
  an IUPAC name also gives the name.

No document holds a property label of any task, a reaction, or an answer of a held-out split; the leakage audit
checks the corpus (`--corpus-out`, then `python -m llasmol.audit corpus=<file>`). The model is the tiny model's
architecture (llasmol/model/arch/tiny-mistral.json with the bundled tokenizer), trained whole (not LoRA) with
AdamW on packed sequences; the card (card.json, README.md) records every setting below, the corpus' counts and
hash, the loss curve and the held-out formula accuracy, and tests/test_demo_base.py holds the shipped card to
these settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "llasmol" / "data" / "bundled" / "raw"
OUT = ROOT / "llasmol" / "model" / "demo_base"
HELD_OUT_SPLITS = ("dev", "test")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the shipped base was made with (its card holds these; tests/test_demo_base.py compares)."""

    seed: int = 0
    molecules: int = 250_000  # corpus molecules in all: the training split's, then BRICS assemblies
    max_fragments: int = 4  # BRICS fragments joined into one new molecule at most
    min_heavy_atoms: int = 2
    max_heavy_atoms: int = 50
    random_spelling: float = 0.15  # share of documents whose SMILES is a random spelling, the canonical one beside
    numbers_per_document: int = 3  # RDKit numbers beside the formula in each document
    held_out_molecules: int = 1_000  # corpus molecules kept out of training: the card's formula accuracy
    seq_len: int = 256
    batch_size: int = 32
    steps: int = 14_000
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # the cosine schedule ends at lr x this
    warmup_steps: int = 300
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    threads: int = 2
    log_every: int = 100
    eval_every: int = 2_000
    tasks: tuple = ()  # bundled tasks whose training split gives molecules; empty: all of them
    # Stage 2, reading: the training split's questions and answers read once, among more fact documents, so that the
    # words of the tasks' templates are words the base has met (after facts alone, the output head held every
    # word it had never been asked for far below the rest, and LoRA, which leaves the head as it is, could not
    # lift them: the default job answered yes/no questions with SMILES)
    reading_steps: int = 1_000
    reading_lr: float = 5e-4
    reading_warmup_steps: int = 50


# ---------------------------------------------------------------------------------------------------- molecules


def _quiet_rdkit() -> None:
    from rdkit import RDLogger

    RDLogger.DisableLog("rdApp.*")


def _records(split: str, tasks: tuple) -> Iterator[tuple[str, dict]]:
    for path in sorted((DATA / split).glob("*.jsonl")):
        if tasks and path.stem not in tasks:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            yield path.stem, json.loads(line)


def split_texts(split: str, tasks: tuple = ()) -> tuple[set[str], set[str]]:
    """The SMILES parts and the IUPAC names of a bundled split, inputs and outputs of every task."""
    from llasmol.core.tasks import get_task

    smiles, names = set(), set()
    for name, record in _records(split, tasks):
        task = get_task(name)
        for value, kind in ((record["input"], task.input_kind), (record["output"], task.family)):
            if not isinstance(value, str):
                continue
            if kind == "smiles":
                smiles.update(p for p in value.split(".") if p)
            elif kind == "iupac":
                names.add(value)
    return smiles, names


def _named_structures(names: set[str]) -> dict[str, str]:
    """name -> SMILES by OPSIN, for the names it reads (Java: OPSIN through py2opsin)."""
    from llasmol.classical.opsin_names import opsin_smiles

    ordered = sorted(names)
    return {n: s for n, s in zip(ordered, opsin_smiles(ordered)) if s}


def connectivity(smiles: str) -> Optional[str]:
    """The first block of the InChIKey (the skeleton, without stereo or charge layers); None if unreadable."""
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    key = Chem.MolToInchiKey(mol)
    return key.split("-")[0] if key else None


def _describe(smiles: str, settings_json: str) -> Optional[dict]:
    """A candidate molecule's canonical form and facts, or None when it is out of bounds (a worker's job)."""
    from rdkit import Chem
    from rdkit.Chem import Crippen, Descriptors, rdMolDescriptors

    from llasmol.core.smiles import canonical_part

    _quiet_rdkit()
    settings = json.loads(settings_json)
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or any(a.GetNumRadicalElectrons() or a.GetAtomicNum() == 0 for a in mol.GetAtoms()):
        return None
    if not settings["min_heavy_atoms"] <= mol.GetNumHeavyAtoms() <= settings["max_heavy_atoms"]:
        return None
    canonical = canonical_part(smiles)
    if not canonical:
        return None
    mol = Chem.MolFromSmiles(canonical)
    key = Chem.MolToInchiKey(mol) if mol is not None else ""
    if not key:
        return None
    numbers = {
        "weight": f"{Descriptors.MolWt(mol):.2f}",
        "logP": f"{Crippen.MolLogP(mol):.2f}",
        "TPSA": f"{rdMolDescriptors.CalcTPSA(mol):.1f}",
        "hydrogen bond donors": str(rdMolDescriptors.CalcNumHBD(mol)),
        "hydrogen bond acceptors": str(rdMolDescriptors.CalcNumHBA(mol)),
        "rotatable bonds": str(rdMolDescriptors.CalcNumRotatableBonds(mol)),
        "rings": str(rdMolDescriptors.CalcNumRings(mol)),
        "aromatic rings": str(rdMolDescriptors.CalcNumAromaticRings(mol)),
        "heavy atoms": str(mol.GetNumHeavyAtoms()),
        "molar refractivity": f"{Crippen.MolMR(mol):.2f}",
    }
    return {"smiles": canonical, "skeleton": key.split("-")[0], "formula": rdMolDescriptors.CalcMolFormula(mol),
            "numbers": numbers}


def _describe_all(candidates: list[str], settings: Settings, workers: int) -> list[Optional[dict]]:
    payload = json.dumps(dataclasses.asdict(settings))
    if workers <= 1:
        return [_describe(s, payload) for s in candidates]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_describe, candidates, [payload] * len(candidates), chunksize=500))


class BricsAssembler:
    """New molecules from BRICS fragments: a random fragment, then at each open attachment point (a dummy atom
    labelled with its BRICS environment) a random fragment whose label BRICS pairs with it, up to
    `max_fragments`; the points left open are capped with hydrogen."""

    def __init__(self, molecules: list[str], rng: random.Random, max_fragments: int) -> None:
        from rdkit import Chem
        from rdkit.Chem import BRICS

        pairs = defaultdict(set)
        for group in BRICS.reactionDefs:
            for a, b, _ in group:
                a, b = int(a.rstrip("ab")), int(b.rstrip("ab"))  # 7a/7b are both written [7*]
                pairs[a].add(b)
                pairs[b].add(a)
        fragments = set()
        for smiles in molecules:
            mol = Chem.MolFromSmiles(smiles)
            if mol is not None and mol.GetNumHeavyAtoms() >= 4:
                fragments.update(BRICS.BRICSDecompose(mol))
        self.fragments = [m for m in (Chem.MolFromSmiles(f) for f in sorted(fragments)) if m is not None and self._open(m)]
        self.by_label = defaultdict(list)
        for mol in self.fragments:
            for idx in self._open(mol):
                self.by_label[mol.GetAtomWithIdx(idx).GetIsotope()].append((mol, idx))
        self.pairs, self.rng, self.max_fragments = pairs, rng, max_fragments

    @staticmethod
    def _open(mol) -> list[int]:
        return [a.GetIdx() for a in mol.GetAtoms() if a.GetAtomicNum() == 0]

    @staticmethod
    def _join(a, at_a: int, b, at_b: int):
        from rdkit import Chem

        combo = Chem.RWMol(Chem.CombineMols(a, b))
        at_b += a.GetNumAtoms()
        na = combo.GetAtomWithIdx(at_a).GetNeighbors()[0].GetIdx()
        nb = combo.GetAtomWithIdx(at_b).GetNeighbors()[0].GetIdx()
        combo.AddBond(na, nb, combo.GetBondBetweenAtoms(at_a, na).GetBondType())
        for idx in sorted((at_a, at_b), reverse=True):
            combo.RemoveAtom(idx)
        return combo.GetMol()

    def build(self) -> Optional[str]:
        from rdkit import Chem

        if not self.fragments:
            return None
        mol = self.rng.choice(self.fragments)
        for _ in range(self.max_fragments - 1):
            open_points = self._open(mol)
            if not open_points:
                break
            point = self.rng.choice(open_points)
            labels = sorted(l for l in self.pairs[mol.GetAtomWithIdx(point).GetIsotope()] if self.by_label[l])
            if not labels:
                break
            other, other_point = self.rng.choice(self.by_label[self.rng.choice(labels)])
            mol = self._join(mol, point, other, other_point)
        capped = Chem.RWMol(mol)
        for idx in sorted(self._open(mol), reverse=True):
            capped.RemoveAtom(idx)
        try:
            Chem.SanitizeMol(capped)
            return Chem.MolToSmiles(capped)
        except Exception:  # an assembly RDKit will not sanitise (a valence broken by the join) is dropped
            return None


def random_spelling(smiles: str, seed: int) -> str:
    """Another SMILES of the same molecule (RDKit's random atom order, Kekule), the same one for the same seed."""
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    Chem.Kekulize(mol, clearAromaticFlags=True)
    (text,) = Chem.MolToRandomSmilesVect(mol, 1, randomSeed=seed, kekuleSmiles=True)
    return text


# ---------------------------------------------------------------------------------------------------- the corpus

FORMULA_PHRASES = ("molecular formula", "formula", "its formula is", "it has the formula")
NAME_PHRASES = ("is named", "IUPAC name", "its name is")


def document(fact: dict, rng: random.Random, settings: Settings, name: Optional[str] = None) -> str:
    """One molecule's document: the SMILES, then its facts in a random order."""
    if rng.random() < settings.random_spelling:
        head = (f"<SMILES> {random_spelling(fact['smiles'], rng.randrange(1 << 30))} </SMILES> is written "
                f"<SMILES> {fact['smiles']} </SMILES>")
    else:
        head = f"<SMILES> {fact['smiles']} </SMILES>"
    picked = rng.sample(sorted(fact["numbers"]), k=min(settings.numbers_per_document, len(fact["numbers"])))
    facts = [f"{rng.choice(FORMULA_PHRASES)} <MOLFORMULA> {fact['formula']} </MOLFORMULA>"]
    facts += [f"{key} <NUMBER> {fact['numbers'][key]} </NUMBER>" for key in picked]
    if name:
        facts.append(f"{rng.choice(NAME_PHRASES)} <IUPAC> {name} </IUPAC>")
    rng.shuffle(facts)
    return head + " : " + " ; ".join(facts) + " ."


def build_corpus(settings: Settings, workers: int, log=print) -> dict:
    """The corpus' documents (training and held-out) and its counts."""
    _quiet_rdkit()
    rng = random.Random(settings.seed)
    held_smiles, held_names = set(), set()
    for split in HELD_OUT_SPLITS:
        smiles, names = split_texts(split)
        held_smiles |= smiles
        held_names |= names
    train_smiles, train_names = split_texts("train", settings.tasks)
    structures = _named_structures(held_names | train_names)
    held_out = {connectivity(s) for s in held_smiles | {structures[n] for n in held_names if n in structures}} - {None}
    log(f"held-out molecules (dev and test, their names' structures too): {len(held_out)} skeletons")

    named = {structures[n]: n for n in sorted(train_names) if n in structures}
    train = sorted(train_smiles | set(named))
    described = _describe_all(train, settings, workers)
    facts, seen = [], set()
    names_of = {}
    for raw, fact in zip(train, described):
        if fact is None or fact["skeleton"] in held_out or fact["smiles"] in seen:
            continue
        seen.add(fact["smiles"])
        facts.append(fact)
        if raw in named:
            names_of[fact["smiles"]] = named[raw]
    excluded_train = sum(1 for f in described if f is not None and f["skeleton"] in held_out)
    from_split = len(facts)
    log(f"training-split molecules: {from_split} kept, {excluded_train} left out as held-out skeletons")

    assembler = BricsAssembler([f["smiles"] for f in facts], rng, settings.max_fragments)
    wanted = settings.molecules - len(facts)
    excluded_new = 0
    attempts = 0
    while wanted > 0 and attempts < 50:
        attempts += 1
        candidates = []
        while len(candidates) < wanted * 1.3 + 100:
            smiles = assembler.build()
            if smiles:
                candidates.append(smiles)
        for fact in _describe_all(candidates, settings, workers):
            if wanted <= 0:
                break
            if fact is None or fact["smiles"] in seen:
                continue
            if fact["skeleton"] in held_out:
                excluded_new += 1
                continue
            seen.add(fact["smiles"])
            facts.append(fact)
            wanted -= 1
    log(f"BRICS molecules: {len(facts) - from_split} from {len(assembler.fragments)} fragments; {excluded_new} "
        "assemblies left out as held-out skeletons")

    order = list(range(len(facts)))
    rng.shuffle(order)
    held_count = min(settings.held_out_molecules, len(order) // 10)
    held_idx, train_idx = order[:held_count], order[held_count:]
    documents = [document(facts[i], rng, settings, names_of.get(facts[i]["smiles"])) for i in train_idx]
    held_docs = [{"smiles": facts[i]["smiles"], "formula": facts[i]["formula"]} for i in held_idx]
    digest = hashlib.sha256("\n".join(documents).encode("utf-8")).hexdigest()
    return {"documents": documents, "held_out": held_docs, "sha256": digest,
            "counts": {"molecules": len(facts), "training_split_molecules": from_split,
                       "brics_molecules": len(facts) - from_split, "brics_fragments": len(assembler.fragments),
                       "documents": len(documents), "held_out_molecules": len(held_docs),
                       "named": len(names_of), "held_out_skeletons": len(held_out),
                       "excluded_training_split": excluded_train, "excluded_assemblies": excluded_new}}


# ---------------------------------------------------------------------------------------------------- training

FORMULA_PROMPT = "<SMILES> {smiles} </SMILES> : molecular formula <MOLFORMULA>"


def batches(token_docs: list[list[int]], settings: Settings, bos: int, eos: int) -> Iterator:
    """Endless (batch, seq_len) blocks of the documents packed end to end, `<s> doc </s>`, in a new seeded order
    each pass (a block may hold the end of one document and the start of the next, as in GPT pretraining)."""
    import torch

    order_rng = random.Random(settings.seed + 1)
    block = settings.batch_size * settings.seq_len
    carry: list[int] = []
    while True:
        order = list(range(len(token_docs)))
        order_rng.shuffle(order)
        for i in order:
            carry += [bos, *token_docs[i], eos]
            while len(carry) >= block:
                yield torch.tensor(carry[:block]).view(settings.batch_size, settings.seq_len)
                carry = carry[block:]


def learning_rate(step: int, settings: Settings) -> float:
    """Linear warm-up, then a cosine from lr to lr x min_lr_ratio at the last step."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def formula_accuracy(model, tokenizer, held_out: list[dict], limit: int = 500) -> float:
    """The share of held-out corpus molecules whose formula the model writes exactly (greedy) after the prompt."""
    import torch

    model.eval()
    right = 0
    tokenizer.padding_side = "left"
    sample = held_out[:limit]
    for start in range(0, len(sample), 100):
        chunk = sample[start:start + 100]
        prompts = [tokenizer.bos_token + FORMULA_PROMPT.format(smiles=m["smiles"]) for m in chunk]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=24, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        for m, row in zip(chunk, out[:, enc["input_ids"].size(1):]):
            text = tokenizer.decode(row, skip_special_tokens=True)
            right += text.split("</MOLFORMULA>")[0].strip() == m["formula"]
    model.train()
    return right / max(1, len(sample))


def reading_documents(settings: Settings) -> list[str]:
    """Stage 2's own documents: every sample of the bundled training split (of `settings.tasks`) as the paper
    formats it, `[INST] {query} [/INST] {response}`, each once."""
    from llasmol.data.source import BUNDLED_DATA, SMolInstructSource

    source = SMolInstructSource(path=str(BUNDLED_DATA), tasks=list(settings.tasks) or None)
    split = source.split("train")
    return [f"[INST] {split[i]['input']} [/INST] {split[i]['output']}" for i in range(len(split))]


def _run_stage(model, optimizer, stream, steps: int, lr_at, settings: Settings, tokenizer, held_out, log,
               name: str) -> dict:
    """`steps` optimizer steps on `stream`'s blocks, the rate `lr_at(step)`; its loss curve and formula accuracy."""
    import torch

    curve, accuracy, window = [], [], []
    started = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        block = next(stream)
        loss = model(input_ids=block, labels=block).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(loss.item())
        done = step + 1
        if done % settings.log_every == 0 or done == steps:
            curve.append([done, round(sum(window) / len(window), 4)])
            window = []
            rate = done * settings.batch_size * settings.seq_len / (time.perf_counter() - started)
            log(f"{name} step {done}/{steps}: loss {curve[-1][1]:.4f}, {rate:,.0f} tokens/s")
        if done % settings.eval_every == 0 or done == steps:
            accuracy.append([done, round(formula_accuracy(model, tokenizer, held_out), 4)])
            log(f"{name} step {done}: formula exact on held-out corpus molecules {accuracy[-1][1]:.3f}")
    return {"steps": steps, "tokens_seen": steps * settings.batch_size * settings.seq_len,
            "seconds": round(time.perf_counter() - started), "loss_curve": curve, "held_out_formula_exact": accuracy}


def _optimizer(model, settings: Settings, lr: float):
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=settings.betas)


def train(settings: Settings, corpus: dict, out: Path, log=print, stage_1: Optional[Path] = None) -> dict:
    """Stage 1 (facts, from random weights) then stage 2 (reading); `stage_1`: a folder this script wrote whose
    weights and card stand for stage 1 (the same settings), so that stage 2 alone runs."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from llasmol.model.base import TINY_TOKENIZER_DIR, arch_config

    torch.set_num_threads(settings.threads)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR))
    token_docs = tokenizer(corpus["documents"], add_special_tokens=False)["input_ids"]
    tokens = sum(len(d) + 2 for d in token_docs)
    log(f"corpus: {len(token_docs)} documents, {tokens:,} tokens with <s> and </s>")
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if stage_1 is not None:
        before = json.loads((stage_1 / "card.json").read_text(encoding="utf-8"))
        facts_only = lambda values: {k: v for k, v in values.items() if not k.startswith("reading")}  # noqa: E731
        if facts_only(before["settings"]) != facts_only(json.loads(json.dumps(dataclasses.asdict(settings)))):
            raise SystemExit(f"{stage_1} was made with other stage-1 settings than these")
        model = AutoModelForCausalLM.from_pretrained(stage_1, dtype=torch.float32)
        facts = before["training"].get("facts", before["training"])
        log(f"stage 1 from {stage_1} ({facts['steps']} steps)")
    else:
        # Initialised as GPT-style pretraining does (normal, std 0.02), not at the random demo's 0.1.
        config = arch_config(ARCH, vocab_size=len(tokenizer), initializer_range=0.02)
        config.bos_token_id, config.eos_token_id, config.pad_token_id = bos, eos, tokenizer.pad_token_id
        torch.manual_seed(settings.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.train()
        facts = _run_stage(model, _optimizer(model, settings, settings.lr), batches(token_docs, settings, bos, eos),
                           settings.steps, lambda step: learning_rate(step, settings), settings, tokenizer,
                           corpus["held_out"], log, "facts")
    model.train()
    # Stage 2: each training sample once among fact documents, to the stage's length, in a seeded order.
    reading = tokenizer(reading_documents(settings), add_special_tokens=False)["input_ids"]
    budget = settings.reading_steps * settings.batch_size * settings.seq_len - sum(len(d) + 2 for d in reading)
    rng = random.Random(settings.seed + 2)
    filler, filled = [], 0
    for i in rng.sample(range(len(token_docs)), len(token_docs)):
        if filled >= budget:
            break
        filler.append(token_docs[i])
        filled += len(token_docs[i]) + 2
    schedule = dataclasses.replace(settings, steps=settings.reading_steps, lr=settings.reading_lr,
                                   warmup_steps=settings.reading_warmup_steps, seed=settings.seed + 3)
    read = _run_stage(model, _optimizer(model, settings, settings.reading_lr),
                      batches(reading + filler, schedule, bos, eos), settings.reading_steps,
                      lambda step: learning_rate(step, schedule), settings, tokenizer, corpus["held_out"], log,
                      "reading")
    read["samples_read"] = len(reading)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    return {"facts": facts, "reading": read, "corpus_tokens": tokens,
            "epochs": round(settings.steps * settings.batch_size * settings.seq_len / tokens, 2),
            "parameters": sum(p.numel() for p in model.parameters())}


ARCH = "tiny-mistral"  # the random tiny model's architecture: model.random_init=true is this base untrained

WHAT_IT_IS = ("A demo base: the tiny model's architecture (2 layers, hidden size 128, 0.8M parameters) pretrained "
              "whole, first on RDKit facts about the bundled training split's molecules, then reading that split's "
              "questions and answers once among more of them. It writes molecular formulas and RDKit numbers for "
              "SMILES it has not seen, and SMILES that RDKit mostly reads. It is not a chemistry model for real use.")
CANNOT_DO = ("It has read each training question once and no other text: LoRA fine-tuning (the default job) teaches "
             "it the tasks. It knows the names of only the training molecules it read, no reaction beyond the "
             "training split's, and no chemistry beyond what RDKit computes from a structure; its numbers are RDKit's "
             "estimates (Crippen logP, TPSA), not measurements. Its tokenizer's merges were learnt from the whole "
             "bundled excerpt's text, dev and test included (vocabulary only; no held-out molecule is in the corpus).")


def write_card(settings: Settings, corpus: dict, training: dict, corpus_seconds: float, out: Path) -> dict:
    import torch

    card = {
        "name": "llasmol demo base",
        "what_it_is": WHAT_IT_IS,
        "cannot_do": CANNOT_DO,
        "architecture": ARCH,
        "settings": json.loads(json.dumps(dataclasses.asdict(settings))),
        "corpus": {**corpus["counts"], "tokens": training["corpus_tokens"], "sha256": corpus["sha256"],
                   "source": "llasmol/data/bundled/raw/train (molecules only); dev and test excluded by skeleton"},
        "training": {k: v for k, v in training.items() if k != "corpus_tokens"},
        "corpus_seconds": round(corpus_seconds),
        "machine": f"{platform.machine()}, {settings.threads} torch threads of {os.cpu_count()} cores, torch "
                   f"{torch.__version__}",
        "command": "python scripts/pretrain_demo_base.py",
    }
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(card_text(card), encoding="utf-8")
    return card


def card_text(card: dict) -> str:
    """The base's model card, from card.json."""
    c, t, s = card["corpus"], card["training"], card["settings"]
    facts, reading = t["facts"], t["reading"]
    lines = [
        "# llasmol demo base", "", card["what_it_is"], "",
        "## What it cannot do", "", card["cannot_do"], "",
        "## Data", "",
        f"{c['molecules']:,} molecules: {c['training_split_molecules']:,} of the bundled training split and "
        f"{c['brics_molecules']:,} assembled from its {c['brics_fragments']:,} BRICS fragments; every molecule of the "
        f"dev and test splits ({c['held_out_skeletons']:,} skeletons, the structures of their IUPAC names included) "
        f"left out ({c['excluded_training_split']} of the training split, {c['excluded_assemblies']} assemblies). "
        f"{c['documents']:,} documents (one a molecule: SMILES, formula, {s['numbers_per_document']} RDKit numbers, "
        f"{c['named']} with their IUPAC name), {c['tokens']:,} tokens, SHA-256 `{c['sha256']}`; "
        f"{c['held_out_molecules']:,} molecules kept out for the accuracy below. Then the "
        f"{reading['samples_read']:,} samples of the training split, `[INST] question [/INST] answer`.", "",
        "## Training", "",
        f"`{card['command']}`: the whole model ({t['parameters']:,} parameters), seed {s['seed']}, AdamW (weight decay "
        f"{s['weight_decay']:g}, gradient norm clipped at {s['grad_clip']:g}), blocks of {s['batch_size']} x "
        f"{s['seq_len']} tokens, on {card['machine']}:", "",
        f"1. facts: {facts['steps']:,} steps ({facts['tokens_seen']:,} tokens, {t['epochs']} passes over the corpus), "
        f"lr {s['lr']:g} (warm-up {s['warmup_steps']}, cosine to x{s['min_lr_ratio']:g}), {facts['seconds'] / 60:.0f} "
        f"minutes after {card['corpus_seconds'] / 60:.0f} of corpus building;",
        f"2. reading: {reading['steps']:,} steps, each training sample once among fact documents, lr "
        f"{s['reading_lr']:g} (warm-up {s['reading_warmup_steps']}, cosine to x{s['min_lr_ratio']:g}), "
        f"{reading['seconds'] / 60:.0f} minutes.", "",
        "| stage | step | loss (nats/token) | formula exact (held-out molecules) |", "|---|---|---|---|",
    ]
    for name, stage in (("facts", facts), ("reading", reading)):
        exact = dict(map(tuple, stage["held_out_formula_exact"]))
        lines += [f"| {name} | {step:,} | {loss:.3f} | {exact[step]:.3f} |" for step, loss in stage["loss_curve"]
                  if step in exact]
    lines += ["", "The whole loss curves are `card.json`'s `training.facts.loss_curve` and `training.reading.loss_curve`.",
              ""]
    return "\n".join(lines)


def _arguments() -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        value = getattr(defaults, f.name)
        if isinstance(value, tuple):
            parser.add_argument(f"--{f.name.replace('_', '-')}", nargs="*", default=list(value))
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", type=Path, default=OUT, help="where the weights and the card go")
    parser.add_argument("--workers", type=int, default=2, help="processes that canonicalise molecules")
    parser.add_argument("--corpus-out", type=Path, help="also write the corpus here, one JSON document a line")
    parser.add_argument("--stage-1", type=Path, help="a folder this script wrote with the same stage-1 settings: "
                        "its weights stand for stage 1, and stage 2 alone runs")
    args = parser.parse_args()
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)}
    values["betas"] = tuple(float(b) for b in values["betas"])
    values["tasks"] = tuple(values["tasks"])
    return Settings(**values), args


def main() -> None:
    settings, args = _arguments()
    started = time.perf_counter()
    corpus = build_corpus(settings, args.workers)
    corpus_seconds = time.perf_counter() - started
    if args.corpus_out:
        args.corpus_out.write_text("".join(json.dumps({"text": d}) + "\n" for d in corpus["documents"]),
                                   encoding="utf-8")
    training = train(settings, corpus, args.out, stage_1=args.stage_1)
    card = write_card(settings, corpus, training, corpus_seconds, args.out)
    print(f"wrote {args.out}: {card['training']['parameters']:,} parameters, held-out formula exact "
          f"{card['training']['reading']['held_out_formula_exact'][-1][1]:.3f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
