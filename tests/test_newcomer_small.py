"""Small things a newcomer met (#70 item 4): the GRPO command's progress bar, train.log on a terminal, and a refused
command's folder that its first line named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import QUICK
from refusals import error_line, run_cli


@pytest.mark.parametrize("epochs, shown", [(-1, "Epoch 0"), (2, "Epoch 0/1"), (None, "Epoch 0")])
def test_the_progress_bar_names_an_epoch_bound_only_where_the_run_has_one(epochs, shown):
    from llasmol.finetune.tracking import ProgressBar

    bar = ProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=epochs)
    text = bar._get_train_description(0)
    assert text.rstrip() == shown and len(text) >= len(bar.validation_description)  # as wide as "Validation"


@pytest.mark.slow
def test_on_a_terminal_the_progress_lines_go_to_train_log_alone(tmp_path):
    """The bar holds the console; train.log, which said nothing between validations there, has the lines."""
    run = tmp_path / "run"
    done = run_cli(["llasmol.train", f"hydra.run.dir={run}", *[o for o in QUICK if "progress_bar" not in o],
                    "trainer.enable_progress_bar=true", "progress_every_s=0", "model.random_init=true"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    log = (run / "train.log").read_text()
    assert "training: from step 0 to 2" in log and "training: 1/2 steps (50%)" in log and "training: 2/2 steps" in log
    assert "training: 1/2 steps" not in done.stderr  # the bar's console has no line of it


@pytest.mark.slow
def test_a_refused_command_says_that_the_folder_its_first_line_named_is_gone(tmp_path):
    done = run_cli(["llasmol.train", "model=mistral"], tmp_path)
    error_line(done, "Mistral-7B")
    folders = [line for line in done.stderr.splitlines() if "held only this command's config and log" in line]
    assert len(folders) == 1 and "outputs/train/" in folders[0] and "nothing was run" in folders[0]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_small_own_table_warns_with_the_counts_and_the_settings_that_change_them(tmp_path, caplog):
    """60 rows split by the hash of each input: validation gets a few, and the demo's epochs make fewer steps than
    one validation interval."""
    import csv
    import json

    from conftest import compose_config

    from llasmol.core.config import PACKAGE_DIR
    from llasmol.train import train

    rows = [json.loads(line) for line in (PACKAGE_DIR / "data/bundled/raw/train/property_prediction-esol.jsonl")
            .read_text().splitlines()[:60]]
    table = tmp_path / "logs.csv"
    with table.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["smiles", "logs"])
        writer.writerows([r["input"], r["output"]] for r in rows)
    cfg = compose_config([f"paths.output_dir={tmp_path / 'run'}", "data=custom", f"data.path={table}",
                          "data.columns.input=smiles", "data.columns.output=logs",
                          '+data.new_tasks.logs={family: number}', "model.random_init=true", "logger=csv",
                          "trainer.enable_progress_bar=false", "callbacks.generation_evaluator.samples_per_task=1",
                          "generation.max_new_tokens_limit=2"])
    with caplog.at_level("WARNING", logger="llasmol.train"):
        train(cfg)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    small = [line for line in said if line.startswith("validation holds only")]
    short = [line for line in said if line.startswith("training takes")]
    assert len(small) == 1 and " row(s) of logs:" in small[0] and "data.split_fractions (now {'validation': 0.1, 'test': 0.1})" in small[0]
    assert len(short) == 1 and "val_every_n_steps=100" in short[0] and "trainer.max_steps" in short[0]
    steps = int(short[0].split()[2])
    assert steps == json.loads((tmp_path / "run" / "result.json").read_text())["global_step"]


@pytest.mark.slow
def test_a_sweep_whose_first_job_fails_before_training_leaves_nothing_and_no_false_continuation(tmp_path):
    done = run_cli(["llasmol.train", "--multirun", "lora=lite,attn", "model=llama2"], tmp_path)
    assert done.returncode != 0 and "Llama-2-7b-hf" in done.stderr
    assert "ckpt_path=last" not in done.stderr  # no job trained: nothing to continue
    assert "run the sweep again with: python -m llasmol.train --multirun lora=lite,attn model=llama2" in done.stderr
    assert not (tmp_path / "outputs").exists()  # no folder holding only multirun.yaml


@pytest.mark.slow
def test_an_evaluation_that_fails_before_its_first_answer_leaves_no_folder(tmp_path):
    done = run_cli(["llasmol.evaluate", "ckpt=osunlp/LlaSMol-Mistral-7B"], tmp_path)
    error_line(done, "osunlp/LlaSMol-Mistral-7B", "not available offline")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_sweep_is_previewed_job_by_job_with_cfg_job(tmp_path):
    done = run_cli(["llasmol.train", "--multirun", "lora=lite,attn", "trainer.max_steps=3,4", "--cfg", "job"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    heads = [line for line in done.stdout.splitlines() if line.startswith("# job")]
    assert heads == ["# job 0: lora=lite trainer.max_steps=3", "# job 1: lora=lite trainer.max_steps=4",
                     "# job 2: lora=attn trainer.max_steps=3", "# job 3: lora=attn trainer.max_steps=4"]
    assert done.stdout.count("max_steps: 4") == 2 and not (tmp_path / "outputs").exists()
    refused = run_cli(["llasmol.train", "--multirun", "lora=lite,attn", "--cfg", "hydra"], tmp_path)
    error_line(refused, "--cfg hydra", "--cfg job")


def test_a_run_whose_own_tasks_declarations_went_missing_says_so(tmp_path):
    """It said "unknown task 'logs'" at the first file that named the task."""
    import json

    from refusals import refused

    from llasmol.core.run_dir import read_tasks

    (tmp_path / "card.json").write_text(json.dumps({"model": "tiny", "lora": {}, "params": {}, "data": "x",
                                                     "tasks": ["logs"], "recipe": "r", "own_tasks": {"logs": "number"}}))
    with refused(str(tmp_path / "tasks.json"), "is missing", "(logs)"):
        read_tasks(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps({"model": "tiny", "lora": {}, "params": {}, "data": "x",
                                                     "tasks": ["forward_synthesis"], "recipe": "r", "own_tasks": {}}))
    assert "logs" not in read_tasks(tmp_path)  # a run of SMolInstruct's tasks alone has none to miss


@pytest.mark.parametrize("argument, named", [
    ("reward.families.smiles=[1,2]", ("reward.families.smiles=[1,2]", "group of settings", "reward.families.smiles.<name>")),
    ("data.also=[{loop}]", ("is a symbolic link loop",))])
def test_a_value_of_the_wrong_shape_or_a_looping_link_is_said_as_such(tmp_path, argument, named):
    from refusals import refused

    from llasmol.core.config import check_overrides
    from llasmol.metrics.rewards import check_rewards

    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    with refused(*named):
        check_overrides("train", ["objective=grpo", argument.format(loop=loop), "+data.new_tasks.assay={family: boolean}"],
                        check_rewards)
        from llasmol.core.config import compose_config
        from llasmol.data.source import SMolInstructSource

        SMolInstructSource(also=[str(loop)]).places()


@pytest.mark.parametrize("caps, warned", [(None, True), ({"validation": 8}, False), ({"validation": 20}, True),
                                           ({"train": 8}, True)])
def test_a_validation_split_capped_on_purpose_is_not_warned_about(caps, warned, caplog):
    """The demo ablation caps validation at 8 a task: chosen, not a small table. A cap the rows do not reach, or a
    cap of another split, leaves the warning."""
    from omegaconf import OmegaConf

    from llasmol.finetune.build import warn_small_data

    split = SimpleNamespace(counts=lambda: {"forward_synthesis": 8, "retrosynthesis": 30})
    datamodule = SimpleNamespace(source=SimpleNamespace(splits={"validation": True}), split=lambda name: split)
    cfg = OmegaConf.create({"data": {"max_samples_per_task": caps, "split_fractions": None}})
    with caplog.at_level("WARNING", logger="llasmol.train"):
        warn_small_data(cfg, datamodule)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation holds only")]
    assert len(said) == int(warned)
    assert not said or "8 row(s) of forward_synthesis:" in said[0] and "retrosynthesis" not in said[0]
