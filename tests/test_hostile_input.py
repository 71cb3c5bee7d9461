"""Careless and hostile input to the commands: every case ends in one paragraph and exit
status 2 before anything is written, or in a run that can be continued; nothing that held a
run is lost."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from es_llm.cli import main
from es_llm.io import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
ES = ROOT / "configs" / "es_countdown_ci.yaml"
GRPO = ROOT / "configs" / "grpo_countdown_ci.yaml"
OPD = ROOT / "configs" / "opd_countdown_ci.yaml"


def refused(capsys, args: list[str], *fragments: str) -> str:
    """Run ``es-llm ARGS`` in-process; it must exit 2 with one line naming ``fragments``."""
    assert main(args) == 2, args
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def broken_copy(ci_testbed: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the ci testbed broken in one way."""
    folder = tmp_path / f"broken-{how}"
    shutil.copytree(ci_testbed, folder)
    if how == "truncated":
        weights = folder / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
    elif how == "config":
        (folder / "config.json").write_text("{this is not json")
    elif how == "tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    return folder


def commands(model: Path, out: Path, ci_testbed: Path) -> dict[str, list[str]]:
    return {
        "eval": ["eval", "--model", str(model), "--task", "countdown", "--backend", "hf",
                 "--out", str(out)],
        "es": ["es", "--config", str(ES), "--out", str(out), f"model={model}"],
        "grpo": ["grpo", "--config", str(GRPO), "--out", str(out), f"model={model}"],
        "opd-teacher": ["opd", "--config", str(OPD), "--out", str(out), f"model={ci_testbed}",
                        f"algo.distill.teacher={model}", "backend=hf"],
    }


@pytest.mark.parametrize("how, step", [("truncated", "the weights failed"),
                                       ("config", "config.json failed"),
                                       ("tokenizer", "the tokenizer files failed")])
def test_a_model_folder_that_does_not_load_is_refused_up_front(ci_testbed, tmp_path, capsys,
                                                               how, step):
    bad = broken_copy(ci_testbed, tmp_path, how)
    for name, args in commands(bad, tmp_path / "out", ci_testbed).items():
        refused(capsys, args, str(bad), step)
        assert not (tmp_path / "out").exists(), name


@pytest.mark.parametrize("args, fragment", [
    (["eval", "--task", "countdown", "--backend", "hf", "sampling.temperature=.nan"],
     "'sampling.temperature' must be a finite number"),
    (["es", "--config", str(ES), "es.sigma=.inf"], "'es.sigma' must be a finite number"),
    (["grpo", "--config", str(GRPO), "optim.lr=-.inf"], "'optim.lr' must be a finite number"),
])
def test_non_finite_numbers_are_refused_at_load(ci_testbed, tmp_path, capsys, args, fragment):
    out = tmp_path / "out"
    model = ["--model", str(ci_testbed)] if args[0] == "eval" else [f"model={ci_testbed}"]
    refused(capsys, [*args, *model, "--out", str(out)], fragment)
    assert not out.exists()


def test_testbed_schedule_and_shape_are_checked(tmp_path, capsys):
    refused(capsys, ["testbed", "--size", "ci", "--out", str(tmp_path / "tb"), "train.steps=-5"],
            "train.steps must be at least 1, got -5")
    refused(capsys, ["testbed", "--size", "ci", "--out", str(tmp_path / "tb"),
                     "model.num_heads=0"], "model.num_heads must be at least 1")
    assert not (tmp_path / "tb").exists()


def test_a_config_file_that_is_not_utf8(ci_testbed, tmp_path, capsys):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("task:\n  name: countdown  # caf\xe9\n".encode("latin-1"))
    refused(capsys, ["eval", "--config", str(cfg), "--model", str(ci_testbed), "--out",
                     str(tmp_path / "o")], "is not UTF-8 text", str(cfg))


def test_yaml_aliases_are_refused_before_they_expand(ci_testbed, tmp_path, capsys):
    # Six levels of ten aliases stand for a million nodes under an unknown key; expanding
    # them before validation took 15 s and 1 GB, one more level ran out of memory.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 7):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    refused(capsys, ["eval", "--config", str(cfg), "--model", str(ci_testbed), "--out",
                     str(tmp_path / "o")], "uses a YAML alias at line 2")
    assert time.perf_counter() - t0 < 10  # a hang guard: nothing was expanded


@pytest.mark.parametrize("command", ["eval", "es", "grpo"])
def test_out_that_is_a_file_or_a_dangling_link(ci_testbed, tmp_path, capsys, command):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    for out, fragment in ((afile, "exists and is not a folder"),
                          (link, "is a symbolic link to")):
        refused(capsys, commands(ci_testbed, out, ci_testbed)[command], fragment)
    assert afile.read_text() == "keep me" and not (tmp_path / "missing").exists()


def every_command(model: Path, out: Path) -> dict[str, list[str]]:
    """One invocation of every command that takes --out, on ``model``."""
    return {
        "testbed": ["testbed", "--size", "ci", "--out", str(out)],
        "eval": ["eval", "--model", str(model), "--task", "countdown", "--out", str(out)],
        "es": ["es", "--config", str(ES), "--out", str(out), f"model={model}"],
        "grpo": ["grpo", "--config", str(GRPO), "--out", str(out), f"model={model}"],
        "opd": ["opd", "--config", str(OPD), "--out", str(out), f"model={model}"],
        "sft": ["sft", "--model", str(model), "--data", str(ROOT / "README.md"), "--out",
                str(out)],
        "compare": ["compare", "--models", f"base={model}", "--out", str(out)],
        "testtime": ["testtime", "--model", str(model), "--out", str(out)],
        "latent-revise": ["latent-revise", "--model", str(model), "--out", str(out)],
    }


def immutable_folder(tmp_path: Path) -> Path | None:
    """A folder even root cannot write in (chattr +i), or None where that is not allowed."""
    folder = tmp_path / "immutable"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        return None
    return folder


@pytest.mark.parametrize("command", ["testbed", "eval", "es", "grpo", "opd", "sft", "compare",
                                     "testtime", "latent-revise"])
def test_an_out_that_cannot_be_created_is_refused_before_anything_loads(tmp_path, capsys,
                                                                        command):
    """The model folder does not exist: an error about --out proves that --out was checked
    first, before anything was loaded, sampled or trained."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    cases = [(Path("/proc/es-llm-out"), "cannot be created in '/proc'"),
             (afile / "sub", "is a file, not a folder")]
    locked = immutable_folder(tmp_path)
    if locked is not None:
        cases.append((locked, "cannot be written in"))
    try:
        for out, fragment in cases:
            refused(capsys, every_command(tmp_path / "no-model", out)[command], str(out),
                    fragment)
        assert afile.read_text() == "keep me"
        assert locked is None or not any(locked.iterdir())
    finally:
        if locked is not None:
            subprocess.run(["chattr", "-i", str(locked)], check=True)


def test_a_log_that_cannot_be_attached_is_bad_input(tmp_path):
    from es_llm.errors import BadInput
    from es_llm.logs import LibraryLog

    locked = immutable_folder(tmp_path)
    if locked is None:
        pytest.skip("chattr +i is not allowed here")
    log = LibraryLog().start()
    try:
        with pytest.raises(BadInput, match="could not write the log"):
            log.attach(locked)
    finally:
        log.finish(2)
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert log.path is not None and not log.path.exists()  # the temporary log is removed


@pytest.fixture(scope="module")
def finished_es(ci_testbed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("es") / "run"
    assert main(["es", "--config", str(ES), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", "iterations=2"]) == 0
    return out


def snapshot(run: Path) -> dict:
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()
            and p.name not in ("log.txt",)}


@pytest.mark.slow
def test_out_that_holds_a_run_is_refused_and_left_intact(ci_testbed, finished_es, capsys):
    before = snapshot(finished_es)
    refused(capsys, ["es", "--config", str(ES), "--out", str(finished_es), f"model={ci_testbed}"],
            "already holds an ES run", f"es-llm es --resume {finished_es}")
    assert snapshot(finished_es) == before


@pytest.mark.slow
def test_resume_refuses_overrides_that_rewrite_history(finished_es, capsys):
    before = snapshot(finished_es)
    refused(capsys, ["es", "--resume", str(finished_es), "es.lr=0.05", "seed=7"],
            "es.lr, seed cannot change", "only iterations, checkpoint_every")
    refused(capsys, ["es", "--resume", str(finished_es), "--model", "elsewhere"],
            "--model cannot change")
    refused(capsys, ["es", "--resume", str(finished_es), "iterations=1"],
            "has already done 2 iterations")
    assert snapshot(finished_es) == before


@pytest.mark.slow
def test_grpo_out_and_resume_rules(ci_testbed, tmp_path, capsys):
    out = tmp_path / "grpo"
    common = ["--no-progress", f"model={ci_testbed}"]
    assert main(["grpo", "--config", str(GRPO), "--out", str(out), *common, "steps=1"]) == 0
    before = snapshot(out)
    refused(capsys, ["grpo", "--config", str(GRPO), "--out", str(out), *common],
            "already holds a grpo run")
    refused(capsys, ["grpo", "--resume", str(out), "algo.loss=gspo"], "algo.loss cannot change")
    assert snapshot(out) == before
    # A run that died before its first checkpoint resumes from the start.
    shutil.rmtree(out / "checkpoints")
    assert main(["grpo", "--resume", str(out), "--no-progress"]) == 0
    assert read_jsonl(out / "metrics.jsonl")[0]["step"] == 0


@pytest.mark.slow
def test_a_write_that_fails_mid_run_names_the_file_and_resume_continues(ci_testbed, tmp_path,
                                                                        capsys):
    full, cut = tmp_path / "full", tmp_path / "cut"
    common = ["--config", str(ES), "--no-progress", f"model={ci_testbed}", "iterations=3",
              "checkpoint_every=1"]
    assert main(["es", "--out", str(full), *common]) == 0
    # A file where the checkpoints folder goes: the first checkpoint, after iteration 0,
    # cannot be written.
    cut.mkdir()
    (cut / "checkpoints").write_text("in the way")
    refused(capsys, ["es", "--out", str(cut), *common],
            f"could not write {str(cut / 'checkpoints' / 'step_1')!r}",
            f"`es-llm es --resume {cut}` continues it")
    assert len(read_jsonl(cut / "ledger.jsonl")) == 1
    (cut / "checkpoints").unlink()
    assert main(["es", "--resume", str(cut), "--no-progress"]) == 0
    final = lambda run: (run / "checkpoints" / "final" / "model.safetensors").read_bytes()  # noqa: E731
    assert final(full) == final(cut)


def test_an_append_log_names_its_file_when_the_disk_is_full(tmp_path):
    from es_llm.errors import BadInput
    from es_llm.run_folder import AppendLog

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    log = AppendLog(Path("/dev/full"), "es-llm es --resume RUN")
    with pytest.raises(BadInput, match=r"could not write '/dev/full' \(No space left on device\)"
                                       r".*es-llm es --resume RUN"):
        log.write("{}\n")


def test_compare_checks_every_input_before_sampling(ci_testbed, tmp_path, capsys):
    out = tmp_path / "cmp"
    refused(capsys, ["compare", "--models", f"base={ci_testbed}", f"base={ci_testbed}",
                     "--task", "countdown", "--backend", "hf", "--out", str(out)],
            "base given more than once")
    cut = tmp_path / "cut.jsonl"
    row = {"problem_id": "a", "sample_index": 0, "completion": "x", "correct": False}
    cut.write_text(json.dumps(row) + "\n" + json.dumps(row)[:20])
    refused(capsys, ["compare", "--models", f"base={ci_testbed}", f"es={cut}", "--task",
                     "countdown", "--backend", "hf", "--out", str(out)], "line 2 is not valid JSON")
    assert not out.exists()


@pytest.mark.slow
def test_results_follow_the_umask(ci_testbed, tmp_path):
    old = os.umask(0o027)
    try:
        out = tmp_path / "eval"
        assert main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--n", "1",
                     "--backend", "hf", "--out", str(out), "--no-progress",
                     "task.limit=2"]) == 0
        es = tmp_path / "es"
        assert main(["es", "--config", str(ES), "--out", str(es), "--no-progress",
                     f"model={ci_testbed}", "iterations=1"]) == 0
    finally:
        os.umask(old)
    files = [out / "config.yaml", out / "samples.jsonl", out / "metrics.json",
             es / "config.yaml", es / "ledger.jsonl", es / "checkpoints" / "final" /
             "model.safetensors"]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    assert stat.S_IMODE((es / "checkpoints" / "final").stat().st_mode) == 0o750


def test_a_limit_reads_only_the_records_it_keeps(tmp_path):
    from es_llm.errors import BadInput
    from es_llm.tasks.loading import load_records

    path = tmp_path / "big.jsonl"
    good = "".join(json.dumps({"id": i, "prompt": "p"}) + "\n" for i in range(2))
    # Everything after the first two records is never read: not even this broken line.
    path.write_text(good + "{broken\n" + good * 50_000)
    assert [r["id"] for r in load_records(path, {"prompt": ("prompt",)}, limit=2)] == [0, 1]
    with pytest.raises(BadInput, match="line 3"):
        load_records(path, {"prompt": ("prompt",)})


@pytest.mark.slow
def test_reading_a_data_file_leaves_no_cache_in_home(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": "p"}) + "\n" for i in range(100)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    code = (f"from es_llm.tasks.loading import load_records; "
            f"assert len(load_records({str(data)!r})) == 100")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert not list((tmp_path / "home").rglob("*.arrow"))
    # Asked for, the cache is used.
    env["HF_DATASETS_CACHE"] = str(tmp_path / "cache")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert list((tmp_path / "cache").rglob("*.arrow"))


@pytest.mark.parametrize("text, fragment", [
    ('{"roles": null}', "is not a roles file"), ("5", "is not a roles file"),
    ('{"roles": [1, 2]}', "is not a roles file"), ("{not json", "is not a roles file"),
    ('{"roles": ["solve", "judge"]}', "names unknown roles ['judge']")])
def test_a_malformed_roles_file_is_refused_by_testtime_and_compare(ci_testbed, tmp_path, capsys,
                                                                   text, fragment):
    model = tmp_path / "model"
    shutil.copytree(ci_testbed, model)
    (model / "roles.json").write_text(text)
    refused(capsys, ["testtime", "--model", str(model), "--out", str(tmp_path / "t")],
            str(model / "roles.json"), fragment)
    refused(capsys, ["compare", "--models", f"base={model}", "--testtime-methods",
                     "independent", "--out", str(tmp_path / "c")], fragment)
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()


def test_sft_data_that_is_not_a_regular_file_is_refused_without_reading_it(ci_testbed, tmp_path,
                                                                           capsys):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)  # reading it would block until a writer comes
    for data in ("/dev/zero", str(fifo), str(tmp_path), str(tmp_path / "missing.jsonl")):
        refused(capsys, ["sft", "--model", str(ci_testbed), "--data", data, "--out",
                         str(tmp_path / "o")], f"the SFT data {data!r} is not a regular file")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, fragment", [
    (["latent-revise", "search.n=0"], "in config section 'search': n (samples per prompt)"),
    (["eval", "--n", "0"], "in config section 'sampling': n (samples per prompt)"),
    (["latent-revise", "revise.steps=0"], "revise.steps (K, Frank-Wolfe steps) must be")])
def test_a_shared_section_is_named_by_its_own_key(ci_testbed, tmp_path, capsys, args, fragment):
    """SamplingConfig serves as sampling, search and eval: its errors name the section in
    use; a section whose message already names itself is left as it is."""
    err = refused(capsys, [*args, "--model", str(ci_testbed), "--out", str(tmp_path / "o")],
                  fragment)
    assert "in config section 'revise'" not in err and "sampling n" not in err
