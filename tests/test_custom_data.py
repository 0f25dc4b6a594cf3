"""Your own data and tasks (docs/data.md, "Your own data and tasks"): a CSV/JSONL task declared in config trains, validates and is
scored with its family's metrics, beside SMolInstruct and weighted; its run reads back as it was written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import compose_config
from refusals import refused

from llasmol.core.config import check_overrides
from llasmol.core.errors import UserError
from llasmol.core.run_dir import read_tasks
from llasmol.core.schema import check_config
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable, get_task
from llasmol.data.custom import read_table
from llasmol.data.sampler import ShardedShuffleSampler, draws
from llasmol.data.source import BUNDLED_DATA, SMolInstructSource

# Molecules of the bundled excerpt with values computed by RDKit (logP) and a ring test: answers a model can
# learn, and that a reader can check.
MOLECULES = ["CCO", "c1ccccc1", "CC(=O)O", "C1CCCCC1", "CCN", "c1ccncc1", "CCCC", "C1CC1", "OCC(O)CO", "c1ccc2ccccc2c1",
             "CC(C)C", "C1CCOC1", "CCOCC", "c1ccoc1", "NCCN", "C1CCNCC1", "CCCl", "Cc1ccccc1", "CO", "O=C1CCCCC1"]


def write_logp_csv(path: Path, header=("smiles", "logp")) -> Path:
    from rdkit import Chem
    from rdkit.Chem import Descriptors

    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for smiles in MOLECULES:
            writer.writerow([smiles, f"{Descriptors.MolLogP(Chem.MolFromSmiles(smiles)):.2f}"])
    return path


def write_ring_jsonl(path: Path) -> Path:
    from rdkit import Chem
    from rdkit.Chem.rdMolDescriptors import CalcNumRings

    with path.open("w") as fh:
        for i, smiles in enumerate(MOLECULES):
            ring = CalcNumRings(Chem.MolFromSmiles(smiles)) > 0
            split = ("train", "train", "train", "dev", "test")[i % 5]  # dev: the archive's name for validation
            fh.write(json.dumps({"input": smiles, "output": ring, "split": split}) + "\n")
    return path


LOGP = {"family": "number", "query": "What is the logP of <INPUT>?", "response": "Its logP is <OUTPUT>."}
RING = {"family": "boolean", "headline": "mcc", "query": ["Does <INPUT> have a ring?", "Is <INPUT> cyclic?"],
        "max_new_tokens": 6}
# The task tables the tests hand to what reads tasks: values, made here once (nothing is declared process-wide).
TABLE = TaskTable({"logp": LOGP, "ring": RING})
LOGP_ONLY = TaskTable({"logp": LOGP})
RING_ONLY = TaskTable({"ring": RING})


def test_a_declared_task_is_a_row_of_the_table_with_its_family_defaults():
    logp, ring = TABLE.task("logp"), TABLE.task("ring")
    assert (logp.answer_tag, logp.headline, logp.pooled, logp.in_smolinstruct) == ("NUMBER", "rmse", False, False)
    assert (ring.answer_tag, ring.headline, dict(ring.generation)) == ("BOOLEAN", "mcc", {"max_new_tokens": 6})
    assert TABLE.task("property_prediction-bbbp").in_smolinstruct
    assert list(TABLE) == [*SMOLINSTRUCT, "logp", "ring"] and TABLE.declared == {"logp": LOGP, "ring": RING}
    assert TABLE.with_declared({"logp": LOGP, "ring": RING}) == TABLE  # the same again: the same task
    with refused("ring", "declared twice"):
        TABLE.with_declared({"ring": {"family": "number"}})
    # SMolInstruct's own table (and the module's lookup, which reads it) never knows a declared task.
    with refused("unknown task 'ring'"):
        SMOLINSTRUCT.task("ring")
    with refused("unknown task 'ring'"):
        get_task("ring")


def test_two_tables_never_see_each_others_declared_tasks():
    """Two runs read in one process (each its own table, from its own declarations) keep their tasks apart; a
    table handed more tasks is a new table, the one it came from unchanged."""
    first = TaskTable({"a": {"family": "number"}})
    second = TaskTable({"b": {"family": "boolean", "headline": "mcc"}})
    assert (first.task("a").family, second.task("b").family) == ("number", "boolean")
    with refused("unknown task 'b'"):
        first.task("b")
    with refused("unknown task 'a'"):
        second.task("a")
    for name in ("a", "b"):
        assert name not in SMOLINSTRUCT
        with pytest.raises(UserError, match=f"unknown task '{name}'"):
            SMOLINSTRUCT.task(name)
        with pytest.raises(UserError, match=f"unknown task '{name}'"):
            get_task(name)
    with refused("unknown task 'b'", "data.tasks"):
        first.check(["a", "b"])
    assert len(first) == len(second) == len(SMOLINSTRUCT) + 1 == 15
    both = first.with_declared(second.declared)
    assert both is not first and set(both.declared) == {"a", "b"} and both.task("b").headline == "mcc"
    assert set(first.declared) == {"a"} and "b" not in first and len(first) == 15  # the original is unchanged
    assert set(second.declared) == {"b"} and "a" not in second
    assert SMOLINSTRUCT.declared == {} and len(SMOLINSTRUCT) == 14
    changed = first.declared  # a copy: changing it changes no table
    changed["c"] = {"family": "boolean"}
    assert "c" not in first and set(first.declared) == {"a"}


@pytest.mark.parametrize("declaration, named", [
    ("{family: numbers}", "data.new_tasks.t.family='numbers'"),
    ("{family: number, colour: red}", "data.new_tasks.t.colour"),
    ("{family: number, answer_tag: '<pic50>'}", "data.new_tasks.t.answer_tag='<pic50>'"),
    ("{family: number, query: 'What is it?'}", "<INPUT>"),
    ("{family: boolean, num_beams: 2, num_return_sequences: 3}", "num_return_sequences=3"),
    ("{family: number, max_new_tokens: 0}", "data.new_tasks.t.max_new_tokens=0"),
    ("{family: number, num_return_sequences: 5}", "data.new_tasks.t.num_return_sequences=5"),  # over the default's 4
    ("{family: boolean, answer_tag: null, response: 'It is <OUTPUT>.'}", "answer_tag=null"),
    # chat-template markers: the prompt puts them around the query and the answer itself
    ("{family: number, query: '[INST] logP of <INPUT>? [/INST]'}", "data.new_tasks.t.query holds '[INST]'"),
    ("{family: number, query: ['Fine <INPUT>', 'logP of <INPUT>?</s><s>']}", "holds '</s>'"),
    ("{family: number, response: '<OUTPUT><|im_end|>'}", "data.new_tasks.t.response holds '<|im_end|>'"),
    ("{family: number, query: '<start_of_turn>user <INPUT>'}", "'<start_of_turn>'"),
    ("{family: number, query: 'logP of <INPUT>?<pad>'}", "holds '<pad>'"),  # the tokenizers' other special tokens
    ("{family: number, response: '<unk> <OUTPUT>'}", "holds '<unk>'"),
])
def test_a_bad_declaration_is_one_line_naming_it(declaration, named):
    cfg = compose_config(["paths.output_dir=/x", "data=custom", "data.path=/x.csv", f"+data.new_tasks.t={declaration}"])
    with refused(named):
        check_config(cfg)


def test_names_that_would_be_two_tasks_or_a_paper_task_are_refused():
    for overrides, named in ((["+data.new_tasks.property_prediction-esol={family: number}"], "SMolInstruct task"),
                             (["+data.new_tasks.a-b={family: number}", "+data.new_tasks.a_b={family: number}"], "'-' and '_'"),
                             (["+data.weights.ring=2"], "data.weights names 'ring'"),
                             (["+data.new_tasks.ring={family: boolean}", "+data.weights.ring=0"], "data.weights.ring=0")):
        with refused(named):
            check_config(compose_config(["paths.output_dir=/x", "data=custom", "data.path=/x.csv", *overrides]))
    with refused("data.path is not set"):
        check_config(compose_config(["paths.output_dir=/x", "data=custom"]))


def test_a_table_is_read_with_its_columns_splits_and_answers_as_the_family_reads_them(tmp_path):
    # A file without a task column holds the one task declared.
    rows = read_table(write_ring_jsonl(tmp_path / "ring.jsonl"), fractions={}, table=RING_ONLY)
    assert [r.output for r in rows[:3]] == ["No", "Yes", "No"]  # JSON true/false read as yes/no
    assert [r.split for r in rows[:5]] == ["train", "train", "train", "validation", "test"]
    rows = read_table(write_logp_csv(tmp_path / "logp.csv"), {"input": "smiles", "output": "logp"},
                      {"validation": 0.2, "test": 0.2}, LOGP_ONLY)
    assert {r.task for r in rows} == {"logp"} and rows[0].number == 2  # its line in the file, after the header
    # Without a split column, an input's hash chooses: the same input always lands in the same split.
    again = read_table(tmp_path / "logp.csv", {"input": "smiles", "output": "logp"}, {"validation": 0.2, "test": 0.2},
                       LOGP_ONLY)
    assert [r.split for r in rows] == [r.split for r in again] and {r.split for r in rows} == {"train", "validation", "test"}
    (tmp_path / "twice.csv").write_text("input,output\nCCO,1.0\nc1ccccc1,2.0\nCCO,1.5\n")
    twice = read_table(tmp_path / "twice.csv", fractions={"validation": 0.5}, table=LOGP_ONLY)
    assert twice[0].split == twice[2].split


@pytest.mark.parametrize("text, named", [
    ("input,output\nCCO,maybe\n", "line 2"),
    ("input,output\nCCO,\n", "no output"),
    ("input,output\nCCO,1,2\n", "more cells"),
    ("input,output,task\nCCO,yes,solubility\n", "unknown task 'solubility'"),
    ("input,output,split\nCCO,yes,holdout\n", "split 'holdout'"),
    ("", "is empty"),
])
def test_a_bad_row_is_one_line_naming_its_file_and_line(tmp_path, text, named):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with refused(named, str(path)):
        read_table(path, table=RING_ONLY)
    (tmp_path / "one.csv").write_text("input,output\nCCO,1\n")
    with refused("names no task", "declared: logp, ring"):
        read_table(tmp_path / "one.csv", table=TABLE)
    (tmp_path / "logp.csv").write_text("input,output\nCCO,1\n")
    assert read_table(tmp_path / "logp.csv", table=TABLE)[0].task == "logp"  # named for its task


@pytest.mark.parametrize("name, data, named", [
    # a quote never closed: the row it opens in is named, not the file's last line (a caption task took the rest of
    # the file as one cell and trained on 3 rows of 9)
    ("own.csv", 'input,output\nC,a\nCC,b\nCCO,"c\nCCCO,d\nCCCCO,e\n', ["line 4", "never closed", '""']),
    ("own.csv", 'input,output\nC,a\nCC,"b"x\n', ["line 3", "not a readable CSV row"]),
    ("own.csv", "\ufeffinput,output\nC,a\n", ["second byte-order mark", "'\\ufeffinput'"]),
    ("own.tsv", "input,output\nC,a\n", ["read at tabs", "name it .csv"]),
    ("own.csv", "smiles,output\nC,a\n", ["no column 'input'", "set data.columns.input=<your column>",
                                           "its columns are output, smiles"]),
    ("own.jsonl", '{"input": "C", "output": "a"}\n{"input": "C", "output": ' + "9" * 5000 + "}\n",
     ["line 2", "holds an integer of more than 4,300 digits"]),
])
def test_a_broken_table_is_named_for_what_is_wrong(tmp_path, name, data, named):
    """What is wrong with a table is said, where it is: not "has no input" for a header Python read otherwise,
    not "not valid JSON" for a number Python will not read. A quoted cell over several lines still reads."""
    path = tmp_path / name
    path.write_bytes(("\ufeff" + data).encode() if data.startswith("\ufeff") else data.encode())
    with refused(str(path), *named):
        read_table(path, table=TaskTable({"own": {"family": "caption"}}))
    (tmp_path / "fine.csv").write_text('input,output\nC,"two\nlines, and a ""quote"""\n')
    assert read_table(tmp_path / "fine.csv", table=TaskTable({"own": {"family": "caption"}}))[0].output == (
        'two\nlines, and a "quote"')


def test_samples_are_the_declared_query_and_the_answer_between_its_tags(tmp_path):
    source = SMolInstructSource(path=str(write_ring_jsonl(tmp_path / "ring.jsonl")), tasks=["ring"], table=TABLE)
    train = source.split("train")
    first, second = train[0], train[1]
    assert first["input"] == "Is <SMILES> CCO </SMILES> cyclic?"  # line 1: the second of the two queries
    assert second["input"] == "Does <SMILES> c1ccccc1 </SMILES> have a ring?" and second["output"] == "<BOOLEAN> Yes </BOOLEAN>"
    assert (len(train), len(source.split("validation")), len(source.split("test"))) == (12, 4, 4)
    assert train.task_row(0).name == "ring" and list(train.core_samples("ring"))[1] == ("c1ccccc1", "Yes", None)
    assert source.table is TABLE and train.table is TABLE  # the table it was handed, and its splits with it
    with refused("unknown task 'ring'"):  # a source of SMolInstruct alone does not know it
        SMolInstructSource(path=str(tmp_path / "ring.jsonl"), tasks=["ring"])


def test_smolinstruct_and_tables_mix_with_weights(tmp_path):
    from conftest import make_datamodule

    from llasmol.model.base import load_tokenizer

    tokenizer = load_tokenizer(compose_config(["paths.output_dir=/x"]).model)
    also = [str(write_logp_csv(tmp_path / "logp.csv", ("input", "output"))), str(write_ring_jsonl(tmp_path / "ring.jsonl"))]
    dm = make_datamodule(tokenizer, path=str(BUNDLED_DATA), tasks=["property_prediction-bbbp", "logp", "ring"],
                         also=also, weights={"ring": 2.5, "smolinstruct": 0.5}, table=TABLE)
    train = dm.split("train")
    assert train.tasks == ["property_prediction-bbbp", "logp", "ring"]
    counts = train.counts()
    assert counts["property_prediction-bbbp"] == 300 and counts["ring"] == 12
    sampler = dm.train_dataloader().sampler
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        drawn = [train.task_row(i).name for i in sampler]
        assert drawn.count("ring") == 30 and drawn.count("property_prediction-bbbp") == 150  # 2.5 x 12, 0.5 x 300
        assert drawn.count("logp") == counts["logp"]
    assert "ring 12 x2.5" in dm.mix()
    (tmp_path / "more").mkdir()
    more = write_ring_jsonl(tmp_path / "more" / "ring.jsonl")
    with refused("task ring is in both"):
        SMolInstructSource(path=str(BUNDLED_DATA), also=[also[1], str(more)], table=TABLE).task_names()
    bbbp = tmp_path / "bbbp.csv"
    bbbp.write_text("input,output,task\nCCO,yes,property_prediction-bbbp\n")
    with refused("SMolInstruct's property_prediction-bbbp", "my_bbbp.family=boolean"):
        SMolInstructSource(path=str(BUNDLED_DATA), also=[str(bbbp)], table=TABLE).task_names()
    (tmp_path / "empty").mkdir()
    with refused("empty holds no SMolInstruct task", "a CSV/JSONL file"):
        SMolInstructSource(path=str(BUNDLED_DATA), also=[str(tmp_path / "empty")], table=TABLE).task_names()
    with refused("data.weights names logs"):
        make_datamodule(tokenizer, path=also[0], weights={"logs": 2}, table=TABLE).mix()
    # a weight for SMolInstruct's tasks where the data holds none of them: it would weigh nothing
    with refused("data.weights.smolinstruct", "holds none (logp)"):
        make_datamodule(tokenizer, path=also[0], weights={"smolinstruct": 2}, table=TABLE).mix()


def test_weights_of_one_keep_the_order_of_no_weights():
    plain = ShardedShuffleSampler(50, seed=3, rank=0, world_size=1)
    ones = ShardedShuffleSampler(50, seed=3, rank=0, world_size=1, weights=[(0, 20, 1.0), (20, 50, 1.0)])
    assert list(plain) == list(ones)
    half = ShardedShuffleSampler(50, seed=3, rank=0, world_size=2, weights=[(0, 20, 0.5), (20, 50, 1.0)])
    picked = []
    for epoch in (0, 1):
        half.set_epoch(epoch)
        picked.append({i for i in half if i < 20})
    assert len(half) == 20 and picked[0] != picked[1]  # (10 + 30) / 2 ranks; a fresh half each epoch


def test_a_declared_task_is_scored_by_its_family():
    from llasmol.metrics.scoring import score_records
    from llasmol.metrics.support import support_note

    records = [{"task": "logp", "gold": ["1.0"], "predictions": ["Its logP is <NUMBER> 1.5 </NUMBER>."]},
               {"task": "logp", "gold": ["2.0"], "predictions": ["no idea"]},
               {"task": "ring", "gold": ["Yes"], "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]},
               {"task": "ring", "gold": ["No"], "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]}]
    metrics = score_records(records, TABLE)
    assert metrics["logp"]["rmse"] == pytest.approx(0.5) and metrics["logp"]["num_no_answer"] == 1
    assert (metrics["ring"]["accuracy"], metrics["ring"]["tp"], metrics["ring"]["fp"]) == (0.5, 1, 1)
    assert support_note("logp", "rmse", metrics["logp"], TABLE) == "n=1 of 2, too few"
    from llasmol.metrics.families import check_headlines

    with refused("data.new_tasks.ring.headline=rmse", "accuracy, f1, mcc"):
        check_headlines(TaskTable({"ring": {**RING, "headline": "rmse"}}))
    with refused("unknown task 'logp'"):  # SMolInstruct's table (the scorer's default) scores none of them
        score_records(records)


@pytest.mark.slow
def test_a_custom_regression_and_yes_no_task_train_validate_evaluate_and_report(tmp_path, caplog):
    """End to end, as a user runs it: SMolInstruct's BBBP beside a CSV regression task and a JSONL yes/no task,
    weighted; the run's files name the tasks, and evaluate and report read them back in a fresh process."""
    from llasmol.analysis import load_run
    from llasmol.evaluate import evaluate
    from llasmol.analysis.report_folder import report_run
    from llasmol.train import train

    csv_file, jsonl = write_logp_csv(tmp_path / "logp.csv", ("input", "output")), write_ring_jsonl(tmp_path / "ring.jsonl")
    out = tmp_path / "run"
    cfg = compose_config([
        f"paths.output_dir={out}", "logger=csv", "trainer.max_steps=2", "val_every_n_steps=2",
        "trainer.enable_progress_bar=false", "data.tasks=[property_prediction-bbbp,logp,ring]",
        f"data.also=[{csv_file},{jsonl}]",
        "+data.new_tasks.logp={family: number, query: 'What is the logP of <INPUT>?'}",
        "+data.new_tasks.ring={family: boolean, headline: mcc, query: 'Does <INPUT> have a ring?', max_new_tokens: 6}",
        "+data.weights={ring: 2}", "callbacks.generation_evaluator.samples_per_task=3",
        "data.split_fractions={validation: 0.3, test: 0.3}",
        "generation.max_new_tokens_limit=8"])
    caplog.set_level("INFO", "llasmol.train")
    train(cfg)
    (out / ".hydra").mkdir()
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    val = json.loads((out / "metrics" / "val-step2.json").read_text())
    held_out = [r.split for r in read_table(csv_file, fractions={"validation": 0.3, "test": 0.3},
                                            table=check_config(cfg).tasks)]
    assert val["logp"]["num_samples"] == min(3, held_out.count("validation")) > 0
    assert "rmse" in val["logp"] and val["ring"]["num_samples"] == 3 and "mcc" in val["ring"]
    queries = [json.loads(line)["input"] for line in (out / "predictions" / "val-step2.jsonl").read_text().splitlines()]
    assert "What is the logP of <SMILES> " in " ".join(queries)
    assert set(read_tasks(out).declared) == {"logp", "ring"}
    assert "ring 12 x2 (" in caplog.text  # the training mix, said at start

    # Nothing process-wide knows them: the run's files say what they are.
    assert "ring" not in SMOLINSTRUCT and "logp" not in SMOLINSTRUCT
    run = load_run(out)
    assert run.table["ring"].headline == "mcc" and set(run.latest.metrics) >= {"logp", "ring"}
    assert set(run.table.declared) == {"logp", "ring"} and "ring" not in SMOLINSTRUCT
    report_run(out)
    table = (out / "report" / "metrics.md").read_text()
    assert "| ring | mcc |" in table and "| logp | rmse |" in table and "2 of your own (logp, ring" in table

    result = evaluate(compose_config([f"paths.output_dir={tmp_path / 'eval'}", f"ckpt={out}", "data.split=test",
                                      "data.max_samples_per_task={test: 2}", "generation.max_new_tokens_limit=6",
                                      "intervals.resamples=0"], "evaluate"))
    assert {t: v["num_samples"] for t, v in result["metrics"].items()} == {
        "property_prediction-bbbp": 2, "logp": min(2, held_out.count("test")), "ring": 2}
    assert set(read_tasks(tmp_path / "eval").declared) == {"logp", "ring"}
    # What the command prints: an own task's headline metric as a built-in one's, from the run's table
    from llasmol.analysis.tables import metric_lines

    printed = metric_lines(result["metrics"], result["intervals"], False, result["tasks"]).splitlines()
    assert any(line.startswith("logp") and "rmse=" in line for line in printed), printed
    assert any(line.startswith("ring") and "mcc=" in line for line in printed), printed
    # An edit of the run's declarations (ring scored as a number) is refused by every reader, not read silently.
    found = json.loads((out / "tasks.json").read_text())
    found["declared"]["ring"]["family"] = "number"
    (out / "tasks.json").write_text(json.dumps(found))
    for read in (lambda: load_run(out), lambda: evaluate(compose_config([f"ckpt={out}"], "evaluate"))):
        with refused(str(out / "tasks.json"), "was changed after the command that wrote it"):
            read()


def test_the_documented_command_declares_the_task_it_says(tmp_path):
    """docs/data.md's command for your own data, composed as given: the task it declares is a number task read
    from the columns it names."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    block = re.search(r"## Your own data and tasks.*?```bash\n(.*?)```", page, re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "llasmol.train"]
    overrides = [w.replace("logs.csv", str(tmp_path / "logs.csv")) for w in words[3:]]
    (tmp_path / "logs.csv").write_text("smiles,logs\nCCO,1.1\nc1ccccc1,-1.6\n")
    values, tasks = check_config(compose_config(["paths.output_dir=/x", *overrides]))
    source = SMolInstructSource.from_config(values["data"])  # its table made from its own new_tasks
    assert tasks.task("logs").family == "number" and source.task_names() == ["logs"]
    assert source.table == tasks and source.table.task("logs").family == "number" and "logs" not in SMOLINSTRUCT
    splits = [source.split(name) for name in ("train", "validation", "test")]
    samples = [split[i] for split in splits for i in range(len(split))]
    sample = samples[0]
    assert len(samples) == 2 and sample["input"].startswith("What is the logS of <SMILES> ") and sample["output"].startswith("<NUMBER> ")


def test_a_folder_in_smolinstructs_layout_holds_a_declared_task(tmp_path):
    """A user's own task written in the archive's layout (here: the bundled ESOL files under another name) is read
    as SMolInstruct's tasks are, once declared; undeclared, its files are not a task."""
    import shutil

    task, name = "property_prediction-esol", "aqsol"
    for file in BUNDLED_DATA.rglob(f"{task}.json*"):
        target = tmp_path / file.relative_to(BUNDLED_DATA).parent / file.name.replace(task, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, target)
    with refused("holds no SMolInstruct task"):
        SMolInstructSource(path=str(tmp_path)).task_names()
    source = SMolInstructSource(path=str(tmp_path), new_tasks={name: {"family": "number"}})
    assert source.task_names() == [name]
    sample = source.split("validation")[0]
    assert sample["task"] == name and "<NUMBER>" in sample["output"] and "<SMILES>" in sample["input"]
    assert name in source.table and name not in SMOLINSTRUCT  # declared for this source alone
    with refused("holds no SMolInstruct task"):
        SMolInstructSource(path=str(tmp_path)).task_names()


@pytest.mark.parametrize("text, columns, named", [
    ("input,output,Split\nCCO,1,test\n", {}, "data.columns.split=Split"),  # would have trained on test rows
    ("smiles,value\nCCO,1\n", {"input": "smiles", "output": "val"}, "no column 'val'"),
    ("input,input,output\nCCO,c1ccccc1,1\n", {}, "'input' twice"),
])
def test_a_column_that_is_not_there_or_twice_is_refused(tmp_path, text, columns, named):
    path = tmp_path / "logp.csv"
    path.write_text(text)
    with refused(named):
        read_table(path, {"input": "input", "output": "output", "split": "split", "task": "task", **columns},
                   table=LOGP_ONLY)
    (tmp_path / "logp.jsonl").write_text('{"input": "CCO", "output": 1, "input": "CC"}\n')
    with refused("'input' twice"):
        read_table(tmp_path / "logp.jsonl", table=LOGP_ONLY)


def test_one_molecule_spelt_two_ways_lands_in_one_split(tmp_path):
    (tmp_path / "logp.csv").write_text("input,output\n" + "".join(
        f"{'C' * n},{n}\nC({'C' * (n - 2)})C,{n}\n" for n in range(3, 40)))
    rows = read_table(tmp_path / "logp.csv", fractions={"validation": 0.3, "test": 0.3}, table=LOGP_ONLY)
    assert [a.split for a in rows[::2]] == [b.split for b in rows[1::2]]
    assert len({r.split for r in rows}) == 3


def test_a_task_that_cannot_train_is_refused_and_an_empty_weight_still_draws(tmp_path):
    from conftest import make_datamodule

    from llasmol.data.resumable_loader import ResumableDataLoader
    from llasmol.data.sampler import draws
    from llasmol.model.base import load_tokenizer

    tokenizer = load_tokenizer(compose_config(["paths.output_dir=/x"]).model)
    (tmp_path / "ring.csv").write_text("input,output,split\nCCO,no,test\nC1CC1,yes,validation\n")
    with refused("task ring has no training sample"):
        make_datamodule(tokenizer, path=str(tmp_path / "ring.csv"), table=RING_ONLY).setup("fit")
    assert draws(10, 0.04) == (0, 1) and draws(10, 2.5) == (2, 5) and draws(0, 0.5) == (0, 0)
    # A resumed run must draw as the saved one did: the weights are part of the position's meaning.
    dm = make_datamodule(tokenizer, path=str(write_ring_jsonl(tmp_path / "ring.jsonl")), weights={"ring": 2},
                         table=RING_ONLY)
    state = dm.train_dataloader().state_dict()
    other = make_datamodule(tokenizer, path=str(tmp_path / "ring.jsonl"), weights={"ring": 0.5},
                            table=RING_ONLY).train_dataloader()
    assert isinstance(other, ResumableDataLoader)
    with refused("the training data changed", "weights"):
        other.load_state_dict(state)


def test_runs_that_ask_one_task_otherwise_read_together_and_a_stray_tasks_file_is_not_read(tmp_path):
    from llasmol.inference.predictions import read_predictions

    both = LOGP_ONLY.with_declared({"logp": {**LOGP, "query": "logP? <INPUT>", "max_new_tokens": 9}})  # scored alike
    assert both.task("logp").generation == () and both.declared == {"logp": LOGP}  # the first declaration kept
    with refused("scored differently"):
        both.with_declared({"logp": {**LOGP, "headline": "num_valid"}})
    assert LOGP_ONLY.task("logp").headline == "rmse"
    (tmp_path / "tasks.json").write_text('["build", "test"]')  # some other tool's file, one folder up
    (tmp_path / "preds").mkdir()
    (tmp_path / "preds" / "p.jsonl").write_text(json.dumps(
        {"task": "property_prediction-bbbp", "input": "CCO", "gold": "No", "predictions": ["No"]}) + "\n")
    assert len(read_predictions(tmp_path / "preds" / "p.jsonl")) == 1
    assert len(read_predictions(tmp_path / "preds" / "p.jsonl", tasks=LOGP_ONLY)) == 1


def test_the_declaration_keys_are_the_schemas_fields():
    import dataclasses

    from llasmol.core.schema import NewTaskSchema
    from llasmol.core.tasks import DECLARATION_KEYS

    assert set(DECLARATION_KEYS) == {f.name for f in dataclasses.fields(NewTaskSchema)}


def test_the_readmes_commands_for_your_own_data_compose_and_check():
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"## Your own data and tasks\n.*?```bash\n(.*?)```", readme, re.S).group(1)
    commands = [c for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert len(commands) == 2
    for command in commands:
        words = shlex.split(command, comments=True)
        assert words[:3] == ["python", "-m", "llasmol.train"]
        values, tasks = check_config(compose_config(["paths.output_dir=/x", *words[3:]]))
        name = next(iter(values["data"]["new_tasks"]))
        assert values["data"]["new_tasks"] and tasks.task(name).in_smolinstruct is False
        assert set(tasks.declared) == set(values["data"]["new_tasks"]) and name not in SMOLINSTRUCT


def test_each_table_of_data_also_can_bring_its_own_columns_and_split_fractions(tmp_path):
    """A CSV with smiles,logp beside a JSONL with input/output: the CSV's place names its own columns; a place that
    names none reads data.path's; a mapping that does not fit its file says which mapping applied and how to give
    one per file."""
    logp = write_logp_csv(tmp_path / "logp.csv")  # smiles,logp
    ring = write_ring_jsonl(tmp_path / "ring.jsonl")  # input,output,split
    own = {"path": str(logp), "columns": {"input": "smiles", "output": "logp"},
           "split_fractions": {"validation": 0.25, "test": 0.25}}
    source = SMolInstructSource(path=str(BUNDLED_DATA), tasks=["property_prediction-bbbp", "logp", "ring"],
                                also=[own, str(ring)], table=TABLE, split_fractions={"validation": 0.1, "test": 0.1})
    counts = {name: source.split(name).counts() for name in ("train", "validation", "test")}
    assert counts["train"]["ring"] == 12 and counts["validation"]["ring"] == 4  # its own split column
    def split_sizes(fractions):
        rows = read_table(logp, own["columns"], fractions, TABLE)
        return [sum(r.split == n for r in rows) for n in ("train", "validation", "test")]

    # its own fractions (split by input), not data.path's
    assert [counts[n]["logp"] for n in ("train", "validation", "test")] == split_sizes(own["split_fractions"])
    assert split_sizes(own["split_fractions"]) != split_sizes(source.split_fractions)
    assert list(source.split("train").core_samples("logp"))[0][0] in MOLECULES
    assert source.reading(str(ring)) == (None, {"validation": 0.1, "test": 0.1}, "data.columns")  # data.path's
    # The CSV without its mapping: data.columns (none given) applied, and the line says how to give it its own.
    with refused(f"{logp} has no column 'input'", "data.columns.input=<your column>", "its columns are logp, smiles",
                 "data.also=[{path: <file>, columns:"):
        SMolInstructSource(path=str(BUNDLED_DATA), also=[str(logp)], table=TABLE).split("train")
    wrong = {"path": str(logp), "columns": {"input": "smile", "output": "logp"}}
    with refused(f"{logp}", "'smile'", "data.also[0].columns.input applied", "smiles"):
        SMolInstructSource(path=str(BUNDLED_DATA), also=[wrong], table=TABLE).split("train")


@pytest.mark.parametrize("place, named", [
    ({"path": "/x.csv", "colums": {"input": "a"}}, ["data.also[0]", "'colums'", "columns:"]),
    ({"columns": {"input": "a"}}, ["data.also[0] has no path"]),
    ({"path": "/x.csv", "columns": {"inpt": "a"}}, ["data.also[0].columns.inpt is no column role"]),
    ({"path": "/x.csv", "columns": {"input": ""}}, ["data.also[0].columns.input=''"]),
    ({"path": "/x.csv", "split_fractions": {"test": 1.5}}, ["data.also[0].split_fractions.test=1.5"]),
    ({"path": "/x.csv", "columns": "smiles"}, ["data.also[0].columns='smiles' must be a mapping"]),
])
def test_a_place_of_data_also_that_is_not_a_path_or_its_mapping_is_one_line(place, named):
    cfg = compose_config(["data=custom", "data.path=/d.csv", "+data.new_tasks.logp={family: number}",
                          "paths.output_dir=/x"])
    cfg.data.also = [place]
    with refused(*named):
        check_config(cfg)


@pytest.mark.parametrize("output", [None, "elsewhere/metrics/m.json"])
def test_scoring_a_file_of_own_tasks_writes_its_metrics_and_nothing_beside(tmp_path, output):
    """`evaluate predictions=<folder>/preds.jsonl` (or with output=<dir>/metrics/m.json) writes the metrics and
    their intervals, not a tasks.json over the user's own file in the predictions' folder or a level above the
    named output: the declarations came from the command line, and no run folder of the command's holds them."""
    from llasmol.evaluate import evaluate

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tasks.json").write_text('["build", "test"]')  # some other tool's file
    preds = folder / "preds.jsonl"
    preds.write_text("".join(json.dumps({"task": "logp", "input": "CCO", "gold": "1.5",
                                         "predictions": [f"<NUMBER> {v} </NUMBER>"]}) + "\n" for v in (1.4, 1.6)))
    overrides = [f"predictions={preds}", "+data.new_tasks.logp={family: number}", f"paths.output_dir={tmp_path / 'cmd'}"]
    if output:
        overrides.append(f"output={tmp_path / output}")
    result = evaluate(compose_config(overrides, "evaluate"))
    assert result["metrics"]["logp"]["rmse"] == pytest.approx(0.1)
    assert (folder / "tasks.json").read_text() == '["build", "test"]'
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    metrics = output or "mine/preds.metrics.json"
    assert written == {"mine/tasks.json", "mine/preds.jsonl", metrics, metrics.replace(".json", ".intervals.json")}


@pytest.mark.parametrize("family, row, role", [
    ("number", "C" * 20_000 + ",1.0", "input"),  # a 20,000-carbon chain: RDKit's writer overflows the C stack on it
    ("smiles", "CCO," + "C" * 4097, "output"),  # one character past the bound
])
def test_a_molecule_past_the_bound_is_one_line_before_rdkit_reads_it(tmp_path, family, row, role):
    """The bound of every SMILES read (llasmol.core.smiles.MAX_SMILES_CHARS): a row past it names its file, line
    and role and stops before any split key or gold is parsed; one at it is read."""
    table = TaskTable({"own": {"family": family}})
    path = tmp_path / "own.csv"
    path.write_text(f"input,output\n{row}\n")
    with refused(str(path), "line 2", f"the {role} of task own", "past the 4,096"):
        read_table(path, fractions={"validation": 0.5}, table=table)
    path.write_text("input,output\n" + ("C" * 4096 + ",1.0" if role == "input" else "CCO," + "C" * 4096) + "\n")
    assert len(read_table(path, fractions={"validation": 0.5}, table=table)) == 1


def test_an_input_pooling_more_golds_than_the_bound_is_one_line_naming_the_row(tmp_path):
    """`MAX_POOLED_GOLDS`: an input of a pooled task gathers at most 1,000 different golds per split (every answer
    to it is scored against all of them); the row that brings the 1,001st is named, at reading, before any work.
    Repeats of a gold, the same input in another split and a task declared `pooled: false` do not count."""
    from llasmol.core.tasks import MAX_POOLED_GOLDS

    assert MAX_POOLED_GOLDS == 1_000
    table = TaskTable({"gen": {"family": "smiles"}, "own": {"family": "smiles", "pooled": False}})
    golds = ["C" * (1 + i % 40) + "O" * (i // 40) for i in range(MAX_POOLED_GOLDS + 1)]
    assert len(set(golds)) == len(golds)
    path = tmp_path / "gen.csv"
    rows = [f"gen,a drug,{g},train" for g in golds[:-1]] + ["gen,a drug,CCO,train", f"gen,a drug,{golds[-1]},test"]
    path.write_text("task,input,output,split\n" + "\n".join(rows) + "\n")
    assert len(read_table(path, table=table)) == MAX_POOLED_GOLDS + 2  # at the bound: read
    path.write_text(path.read_text() + f"gen,a drug,{golds[-1]},train\n")
    with refused(str(path), f"line {MAX_POOLED_GOLDS + 4}", "'a drug'", "task gen", "more than 1,000",
                 "+data.new_tasks.gen.pooled=false"):
        read_table(path, table=table)
    path.write_text(path.read_text().replace("gen,", "own,"))  # each sample against its own gold: no pool
    assert len(read_table(path, table=table)) == MAX_POOLED_GOLDS + 3


def test_a_predictions_file_whose_input_pools_past_the_bound_is_one_line_naming_its_line(tmp_path):
    """The scorer's pool and a predictions file's reader keep one bound: the line that brings an input's 1,001st
    different gold (here one line with all of them) is named before any answer is scored."""
    from llasmol.core.tasks import MAX_POOLED_GOLDS
    from llasmol.inference.predictions import read_predictions
    from llasmol.metrics.scoring import GoldPool

    golds = ["C" * (1 + i % 40) + "O" * (i // 40) for i in range(MAX_POOLED_GOLDS + 1)]
    line = {"task": "molecule_generation", "input": "a drug", "predictions": ["<SMILES> CCO </SMILES>"]}
    path = tmp_path / "preds.jsonl"
    path.write_text(json.dumps({**line, "gold": golds[:2]}) + "\n" + json.dumps({**line, "gold": golds[1:-1]}) + "\n")
    assert len(read_predictions(path)) == 2  # 1,000 different golds: read
    path.write_text(path.read_text() + json.dumps({**line, "gold": golds[-1]}) + "\n")
    with refused(f"{path} line 3", "'a drug'", "molecule_generation", "more than 1,000", "leave out samples"):
        read_predictions(path)
    path.write_text(json.dumps({**line, "gold": golds}) + "\n")
    with refused(f"{path} line 1", "more than 1,000"):
        read_predictions(path)
    pool = GoldPool()  # a task scored against each sample's own label never pools
    pool.add({"task": "property_prediction-bbbp", "input": "CCO"}, ["Yes"] * 3 + [str(i) for i in range(2_000)])


def test_a_question_about_a_molecule_past_the_bound_is_one_line_before_the_model_loads():
    from llasmol.core.smiles import MAX_SMILES_CHARS, canonical_kekule, canonicalize_query
    from llasmol.generate import generate

    huge = "Is <SMILES> " + "C" * 20_000 + " </SMILES> toxic?"
    assert canonical_kekule("C" * 20_000) is None and canonicalize_query(huge) == huge  # not given to RDKit
    assert canonical_kekule("C" * MAX_SMILES_CHARS) == "C" * MAX_SMILES_CHARS
    assert canonical_kekule("C" * (MAX_SMILES_CHARS + 1)) is None and canonical_kekule("CC." + "C" * 4097) is None
    with refused("the query's SMILES is 20,000 characters", "past the 4,096"):
        generate(compose_config(["model=tiny", "ckpt=none"], "generate"), huge)


@pytest.mark.parametrize("override, named", [
    ("data.columns.input=output", ["data.columns", "'output'", "both input and output"]),
    ("data.columns={input: smiles, output: smiles}", ["'smiles'", "both input and output"]),
    ("data.columns.split=task", ["'task'", "both split and task"]),
])
def test_a_column_read_as_two_roles_is_one_line_at_the_config_check(override, named):
    """docs/data.md: a column named twice is an error, not a table whose outputs train as its inputs."""
    with refused(*named):
        check_config(compose_config(["data=custom", "data.path=/x/logs.csv", override, "paths.output_dir=/x",
                                     "+data.new_tasks.logs={family: number}"]))
    check_config(compose_config(["data=custom", "data.path=/x/logs.csv", "data.columns.input=smiles",
                                 "data.columns.output=logs", "paths.output_dir=/x", "+data.new_tasks.logs={family: number}"]))


@pytest.mark.parametrize("name, twin", [("Forward_Synthesis", "forward_synthesis"), ("LOGS", "logs"),
                                        ("property_prediction-BBBP", "property_prediction-bbbp")])
def test_a_declared_task_that_differs_only_by_letter_case_is_refused(name, twin):
    with refused(name, twin, "letter case"):
        check_config(compose_config(["paths.output_dir=/x", "+data.new_tasks.logs={family: number}",
                                     f"+data.new_tasks.{name}={{family: number}}"]))


def test_a_nul_byte_in_a_cell_is_one_line_naming_the_row(tmp_path):
    path = tmp_path / "logp.csv"
    path.write_text("input,output\nCCO,1.0\nC\x00CO,2.0\n")
    with refused(str(path), "line 3", "input holds a NUL byte", "character 1"):
        read_table(path, table=LOGP_ONLY)


@pytest.mark.parametrize("declaration, exact", [("{family: smiles}", 1.0), ("{family: smiles, pooled: false}", 0.5)])
def test_a_declared_smiles_task_pools_the_golds_of_one_input_as_its_family_does(tmp_path, declaration, exact):
    """An input asked twice with two golds, answered with the second: scored against both golds, as the official
    scorer pools every SMILES, formula, IUPAC and caption task's (one right answer of the input's golds counts),
    unless the declaration says pooled: false."""
    from llasmol.evaluate import evaluate

    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"task": "product", "input": "CCO", "gold": gold,
                                         "predictions": ["<SMILES> CCC </SMILES>"]}) + "\n" for gold in ("CC", "CCC")))
    result = evaluate(compose_config([f"predictions={preds}", f"+data.new_tasks.product={declaration}",
                                      f"paths.output_dir={tmp_path / 'cmd'}", "intervals.resamples=0"], "evaluate"))
    assert result["metrics"]["product"]["exact_match"] == exact


@pytest.mark.parametrize("value", ["inf", "-Infinity", "nan", "NaN", "1e400"])
def test_a_non_finite_number_gold_is_one_line_naming_the_row(tmp_path, value):
    path = tmp_path / "logp.csv"
    path.write_text(f"input,output\nCCO,1.5\nCCC,{value}\n")
    with refused(str(path), "line 3", repr(value), "not a finite number"):
        read_table(path, table=LOGP_ONLY)
    path.write_text("input,output\nCCO,1.5\nCCC,-1e300\n")  # huge but finite: a gold
    assert [r.output for r in read_table(path, table=LOGP_ONLY)] == ["1.5", "-1e300"]


def test_a_tasks_beams_come_from_generation_tasks_over_its_declaration_over_the_default():
    """Each pair of sources both ways round: a declaration's beams over generation.default; generation.tasks.<t>
    over the declaration; what neither sets from the default; the cap over all of them."""
    from llasmol.inference.beam_search import BeamSettings, task_settings

    own = TaskTable({"a": {"family": "smiles", "num_beams": 6, "num_return_sequences": 2},
                     "b": {"family": "smiles", "max_new_tokens": 40}})
    gen = compose_config(["model=mistral", "+generation.tasks.b={num_beams: 3}"], "generate").generation
    assert task_settings(gen, "a", own) == BeamSettings(6, 2, 1024, False)  # declared over default
    assert task_settings(gen, "b", own) == BeamSettings(3, 1, 40, False)  # generation.tasks over both
    gen = compose_config(["model=mistral", "+generation.tasks.a={num_beams: 9}", "generation.max_new_tokens_limit=30"],
                         "generate").generation
    assert task_settings(gen, "a", own) == BeamSettings(9, 2, 30, False)
    assert task_settings(gen, "b", own) == BeamSettings(4, 1, 30, False)  # the cap under a declared 40


def test_weighted_drawing_keeps_its_promises_beyond_the_counts():
    """data.weights, block by block: 2.3 draws every sample twice and 3 of 10 a third time, 0.25 draws 5 of 20
    samples at most once each, 0.1 of 3 still draws one; nothing outside its block, a fresh choice each epoch, the
    same choice on every rank, and the ranks' shares disjoint and together the epoch (one left over for 2 ranks)."""
    from collections import Counter

    blocks = [(0, 10, 2.3), (10, 30, 0.25), (30, 33, 0.1)]
    assert [draws(end - start, w) for start, end, w in blocks] == [(2, 3), (0, 5), (0, 1)]
    chosen = []
    for epoch in (0, 1, 2):
        shares = []
        for rank in (0, 1):
            sampler = ShardedShuffleSampler(33, seed=5, rank=rank, world_size=2, weights=blocks)
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
            assert len(shares[-1]) == len(sampler) == 14  # (23 + 5 + 1) // 2
        whole = ShardedShuffleSampler(33, seed=5, rank=0, world_size=1, weights=blocks)
        whole.set_epoch(epoch)
        epoch_counts = Counter(whole)
        assert sum(epoch_counts.values()) == 29 and set(epoch_counts) <= set(range(33))
        assert sorted(Counter(i for i in epoch_counts.elements() if i < 10).values()).count(3) == 3
        assert all(epoch_counts[i] in (2, 3) for i in range(10))
        assert sum(1 for i in range(10, 30) if epoch_counts[i]) == 5 and all(epoch_counts[i] <= 1 for i in range(10, 33))
        assert sum(epoch_counts[i] for i in range(30, 33)) == 1
        assert not Counter(shares[0] + shares[1]) - epoch_counts  # the shares are a part of the epoch's draws
        chosen.append(frozenset(i for i in epoch_counts if 10 <= i < 30))
    assert len(set(chosen)) > 1  # drawn anew each epoch


def test_one_task_table_is_built_per_command_for_its_declared_tasks(monkeypatch, tmp_path):
    """The command line's check, `start` and the data source each ask for the table `data.new_tasks` makes: it is
    built once and handed out again (instrumented here, not in the product)."""
    from llasmol.core import schema
    from llasmol.core import tasks as tasks_module
    from llasmol.data.source import SMolInstructSource
    from llasmol.frame import start
    from llasmol.train import _check_rewards

    monkeypatch.setattr(schema, "_TABLES", {})  # as a fresh process starts: no table built by an earlier test
    built, real_init = [], tasks_module.TaskTable.__init__
    monkeypatch.setattr(tasks_module.TaskTable, "__init__", lambda self, *a, **k: built.append(self) or real_init(self, *a, **k))
    table = tmp_path / "t.csv"
    table.write_text("input,output,task\nCCO,0.1,logp\n")
    overrides = ["data=custom", f"data.path={table}", "+data.new_tasks.logp={family: number}", f"paths.output_dir={tmp_path}"]
    check_overrides("train", overrides, _check_rewards)
    cfg = compose_config(overrides)
    held = start(cfg, torch=False).tasks
    source = SMolInstructSource.from_config(cfg.data)
    assert len(built) == 1 and held is source.table is built[0] and "logp" in held
    start(compose_config([*overrides[:2], "+data.new_tasks.logp={family: boolean}", overrides[3]]), torch=False)
    assert len(built) == 2 and built[1]["logp"].family == "boolean"  # another declaration: another table
