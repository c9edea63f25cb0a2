"""Cases modelled on public bug reports of comparable projects, round 6 (issue 52): nothing a run trained
or recorded is lost, whatever ends it; a refusal is one line naming the flag or file; a path prints on any
stdout."""
import errno
import io
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import train
import train_loopvae
from training import evaluation, exits
from test_folders import images
from test_train import ROOT, TINY, cmd, fake_cifar, load, run

pytestmark = pytest.mark.slow  # (train.py runs: README's quick tier, -m "not slow", leaves them out)

SYNTH = TINY + ["--data", "synthetic", "--max-steps", "4", "--epochs", "1"]


def lines(capsys):
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("train.py:")]


# ----------------------------------------------------------------------------- a path on any stdout
def ascii_stdout(monkeypatch):
    """sys.stdout as a terminal set to ASCII has it (PYTHONIOENCODING=ascii): strict; returns its bytes."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True))
    return raw


def test_a_stdout_that_cannot_encode_a_path_prints_it_escaped(tmp_path, monkeypatch):
    """A non-ASCII --out-dir on an ASCII stdout: train.py prints its lines with the path escaped (before:
    UnicodeEncodeError at the first line naming it; the lab's tools: lab/tests/test_lab_failures.py)."""
    out = tmp_path / "r\u00e9sultats"
    r = run(SYNTH + ["--out-dir", str(out)], env={"PYTHONIOENCODING": "ascii"})
    escaped = str(out).encode("ascii", "backslashreplace").decode()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"run folder: {escaped}" in r.stdout and f"done: {escaped} holds" in r.stdout


# ----------------------------------------------------------------------------- what a line counts
def test_evaluation_under_torchrun_counts_the_images_of_every_process(tmp_path):
    """2 processes, 64 validation images: the epoch's evaluation and --eval-depths name 64 (each process
    holds 32 of them; the lines used to say 32)."""
    from test_cluster import torchrun
    r = torchrun(SYNTH[:-4] + ["--data", "synthetic", "--val-subset", "64", "--batch-size", "16", "--max-steps", "2",
                               "--eval-depths", "1", "--out-dir", str(tmp_path / "o")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 0: evaluating on 64 validation images" in r.stdout, r.stdout
    assert "evaluating at depth 1 on 64 validation images" in r.stdout, r.stdout


# ----------------------------------------------------------------------------- how a run stops
def test_past_max_bad_images_mid_epoch_the_steps_since_the_last_checkpoint_are_saved_first(tmp_path, capsys):
    """One undecodable image of 16 (--max-bad-images 0), met in step 6 of 8: one line naming it, and
    the 5 steps before it saved (they were lost); without the file, the printed command continues."""
    root = images(tmp_path / "d", [f"{s}/{c}/{k}.png" for s in ("train", "val") for c in ("ant", "bee")
                                   for k in range(8 if s == "train" else 2)])
    victim = root / "train" / "ant" / "0.png"
    victim.write_bytes(b"not an image")
    out = tmp_path / "o"
    job = TINY + ["--data", "imagenet", "--data-dir", str(root), "--img-size", "16", "--patch-size", "8",
                  "--batch-size", "2", "--epochs", "1", "--max-bad-images", "0", "--out-dir", str(out)]
    assert train.cli(job) == 2
    err = lines(capsys)
    assert len(err) == 1 and f"the last {victim}; fix or remove them" in err[0], err
    assert f"checkpoint {out / 'ckpt.pt'} (step 5); continue with: python train.py " in err[0], err
    ck = load(out / "ckpt.pt")
    assert (ck["step"], ck["epoch"], ck["batch"]) == (5, 0, 5)
    victim.unlink()
    assert train.cli(job + ["--resume", str(out / "ckpt.pt")]) == 0, capsys.readouterr().err
    assert load(out / "ckpt.pt")["step"] == 7  # (15 images now: 7 steps of 2)


def test_ctrl_c_in_an_epochs_evaluation_says_what_it_does_and_a_second_one_keeps_the_epochs_training(
        tmp_path, capsys, monkeypatch):
    """Ctrl-C while epoch 0 is evaluated: a line at once says that the evaluation finishes and the epoch
    is checkpointed (it used to say nothing), then exit 75 as before. Ctrl-C twice there: exit 130, and
    the epoch's training is in the checkpoint (it used to be lost); the printed command continues."""
    real = evaluation.evaluate
    presses = []

    def ctrl_c_in_the_epochs_evaluation(*a, depth=None, **kw):
        if depth is None:
            for _ in presses:
                os.kill(os.getpid(), signal.SIGINT)
        return real(*a, depth=depth, **kw)
    monkeypatch.setattr(evaluation, "evaluate", ctrl_c_in_the_epochs_evaluation)
    monkeypatch.setattr(exits.Stop, "AGAIN_S", 0.0)  # a second SIGINT is a second Ctrl-C
    job = TINY + ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--epochs", "2"]  # 8 steps each
    presses[:] = [1]
    assert train.cli(job + ["--out-dir", str(tmp_path / "once")]) == exits.PREEMPTED
    err = capsys.readouterr().err
    assert "stop requested by SIGINT (Ctrl-C): the run stops after the evaluation of epoch 0 (32 images), with the " \
           "epoch's checkpoint; Ctrl-C again, a second or more from now, stops at once, saving the epoch's training " \
           "first, without its evaluation" in err, err
    assert "stopped by SIGINT (Ctrl-C) after step 8 of 16, the end of epoch 0" in err
    out = tmp_path / "twice"
    presses[:] = [1, 2]
    assert train.cli(job + ["--out-dir", str(out)]) == exits.INTERRUPTED
    err = lines(capsys)
    assert len(err) == 1 and "stopped at once by a second Ctrl-C in the evaluation of epoch 0, whose training was " \
        f"saved first (its evaluation is not in log.jsonl); checkpoint {out / 'ckpt.pt'} (step 8)" in err[0], err
    ck = load(out / "ckpt.pt")
    assert (ck["step"], ck["epoch"], ck["batch"]) == (8, 1, 0) and not (out / "log.jsonl").exists()
    presses[:] = []
    assert train.cli(err[0].split("continue with: python train.py ")[1].split()) == 0
    assert [json.loads(ln)["epoch"] for ln in open(out / "log.jsonl")] == [1] and load(out / "ckpt.pt")["step"] == 16


# ----------------------------------------------------------------------------- what a run recorded
def test_a_log_whose_last_line_was_cut_mid_write_is_repaired_when_the_run_resumes(tmp_path, capsys):
    """log.jsonl cut in the middle of its last record (a kill or a full disk during the write): --resume
    removes the broken line, the checkpoint's record of that epoch is written again, every line parses
    (the record used to be appended onto the broken line). A record cut just before its newline keeps
    its text and gets the newline."""
    job = TINY + ["--data", "cifar100", "--data-dir", fake_cifar(tmp_path / "data"), "--epochs", "3"]  # 8 steps each
    out = tmp_path / "o"
    assert train.cli(job + ["--max-steps", "8", "--out-dir", str(out)]) == 0
    log = out / "log.jsonl"
    log.write_bytes(log.read_bytes()[:-40])
    capsys.readouterr()
    assert train.cli(job + ["--max-steps", "16", "--out-dir", str(out), "--resume", "auto"]) == 0
    said = capsys.readouterr().out
    assert "log.jsonl: its last line was cut off mid-write" in said and "added the record of epoch 0" in said, said
    assert [json.loads(ln)["epoch"] for ln in log.read_text().splitlines()] == [0, 1]
    log.write_bytes(log.read_bytes()[:-1])  # the last record whole, its newline missing
    assert train.cli(job + ["--out-dir", str(out), "--resume", "auto"]) == 0
    assert "log.jsonl: its last record had no line end" in capsys.readouterr().out
    assert [json.loads(ln)["epoch"] for ln in log.read_text().splitlines()] == [0, 1, 2]


def test_a_new_run_in_a_folder_with_an_earlier_runs_log_is_refused(tmp_path, capsys):
    """A folder holding log.jsonl but no ckpt.pt (removed, or a run kept without it): a new run there
    would mix two runs' records in one log and overwrite args.json; one line, exit 2, nothing written."""
    out = tmp_path / "o"
    assert train.cli(SYNTH + ["--out-dir", str(out)]) == 0
    (out / "ckpt.pt").unlink()
    before = {f: (out / f).read_bytes() for f in ("log.jsonl", "args.json")}
    capsys.readouterr()
    assert train.cli(SYNTH + ["--lr", "0.01", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out-dir {out} holds the log.jsonl of an earlier run" in err[0], err
    assert {f: (out / f).read_bytes() for f in before} == before and not (out / "ckpt.pt").exists()


# ----------------------------------------------------------------------------- class folders that changed
def folders_run(tmp_path):
    """A 1-step run on an image folder of the classes ant and bee: (its flags, data root, run folder)."""
    root = images(tmp_path / "d", [f"{s}/{c}/{k}.png" for s in ("train", "val") for c in ("ant", "bee")
                                   for k in range(4)])
    out = tmp_path / "o"
    job = TINY + ["--data", "imagenet", "--data-dir", str(root), "--img-size", "16", "--patch-size", "8", "--epochs",
                  "2", "--out-dir", str(out)]
    assert train.cli(job + ["--max-steps", "1"]) == 0
    return job + ["--resume", str(out / "ckpt.pt")], root, out


def test_a_class_folder_renamed_or_added_before_a_resume_is_refused_naming_it(tmp_path, capsys):
    """bee renamed to wasp: every label after it would shift without a word (the run went on and the
    checkpoint's class names were overwritten); cat added: the line said "use the size flags of the
    original run", which no flag can. Both refused, naming the classes, the checkpoint unchanged."""
    job, root, out = folders_run(tmp_path)
    before = (out / "ckpt.pt").read_bytes()
    for split in ("train", "val"):
        os.rename(root / split / "bee", root / split / "wasp")
    capsys.readouterr()
    assert train.cli(job) == 2
    err = lines(capsys)
    assert len(err) == 1 and "the class folders of its train/ differ from the checkpoint's 2: bee is gone; wasp is " \
        "new; the labels would no longer mean the classes it learnt" in err[0], err
    assert (out / "ckpt.pt").read_bytes() == before
    for split in ("train", "val"):
        os.rename(root / split / "wasp", root / split / "bee")
    images(root, ["train/cat/0.png", "val/cat/0.png"])
    assert train.cli(job) == 2
    err = lines(capsys)
    assert len(err) == 1 and "differ from the checkpoint's 2: cat is new" in err[0] and "size flags" not in err[0], err
    assert f"--finetune {out / 'ckpt.pt'}" in err[0] and (out / "ckpt.pt").read_bytes() == before


def test_eval_only_names_a_validation_class_the_checkpoint_lacks_as_such(tmp_path, capsys):
    """val/cat, with train/cat added after the run: --eval-only takes the classes from the checkpoint, and
    its line said "class folder cat is not in train/", where it is."""
    job, root, out = folders_run(tmp_path)
    images(root, ["train/cat/0.png", "val/cat/0.png"])
    capsys.readouterr()
    assert train.cli(["--eval-only", "--resume", str(out), "--out-dir", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "class folder cat is not one of the checkpoint's 2 classes" in err[0], err


# ----------------------------------------------------------------------------- the tools
def test_bench_json_into_a_folder_that_does_not_exist_creates_it_and_an_unwritable_one_is_one_line(
        tmp_path, monkeypatch, capsys):
    """bench.py --json NEW/bench.json: a FileNotFoundError traceback after the first measurement; now the
    folder is made, as --out-dir is. A path that cannot be written is refused before anything runs."""
    import bench
    path = tmp_path / "new" / "folder" / "bench.json"
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--smoke", "--only", "matmul", "--json",
                                      str(path)])
    assert bench.main() == {}
    assert json.loads(path.read_text())["matmul_tflops"] > 0
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(sys, "argv", ["bench.py", "--smoke", "--json", str(tmp_path / "a_file" / "bench.json")])
    with pytest.raises(SystemExit) as e:
        bench.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "Traceback" not in "".join(err), err
    assert f"bench.py: error: --json {tmp_path / 'a_file' / 'bench.json'} cannot be written (" in err[-1], err


# ----------------------------------------------------------------------------- flags
def test_a_64_bit_seed_is_one_line_and_the_largest_seeds_train_on_every_data_path(tmp_path, capsys):
    """--seed 2**64 - 1 overflowed the seeds derived from it (an OverflowError / ValueError traceback in
    the first batch); now a refusal naming the range. The range's ends train on the batched CIFAR path
    (whose image hash multiplies the seed most), the per-image one and synthetic images (lab/probe.py's
    --seed takes the same range: lab/tests/test_lab_failures.py)."""
    for seed in (2 ** 64 - 1, 2 ** 63, -2 ** 40):
        assert train.cli(SYNTH + ["--seed", str(seed), "--out-dir", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "argument --seed: must be between -99999999 and 99999999" in err[0], err
    cifar = fake_cifar(tmp_path / "data")
    for seed in (99999999, -99999999):
        for where in (["--data", "cifar100", "--data-dir", cifar], ["--data", "cifar100", "--data-dir", cifar,
                                                                    "--cpu-loader"], ["--data", "synthetic"]):
            out = tmp_path / f"{seed}-{len(where)}"
            assert train.cli(TINY + where + ["--seed", str(seed), "--max-steps", "2", "--out-dir", str(out)]) == 0


def test_compile_on_a_machine_without_a_cpp_compiler_is_one_line_before_anything_runs(tmp_path, capsys):
    """inductor's own compiler search finds none (its config names a compiler that is not there): --compile
    was a traceback at the first step, now one line naming the flag before the run folder is written. The
    config is changed through inductor's own patch(), which restores it exactly (setattr on its config
    object and undoing it left no `cpp.cxx` entry on torch 2.14: every later compile in the process failed)."""
    import torch._inductor.config as inductor_config
    out = tmp_path / "o"
    with inductor_config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))}):
        assert train.cli(SYNTH + ["--compile", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error: --compile: torch.compile finds no C++ compiler"), err
    assert "or leave out --compile" in err[0] and not out.exists()


def test_download_offline_with_a_partial_archive_is_one_line(tmp_path, capsys, monkeypatch):
    """--download on a machine without network, a partial archive left by an earlier attempt: a URLError
    traceback; now one line naming the archive and what to do."""
    import urllib.error
    import urllib.request

    def offline(*a, **kw):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    root = tmp_path / "data"
    root.mkdir()
    (root / "cifar-100-python.tar.gz").write_bytes(b"\x1f\x8b" + bytes(3 * 2 ** 20))  # 3 MB of 161
    assert train.cli(TINY + ["--data", "cifar100", "--data-dir", str(root), "--download", "--out-dir",
                             str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--download: fetching CIFAR-100 into" in err[0] and "URLError" in err[0], err
    assert f"{root / 'cifar-100-python.tar.gz'} (3 MB) is incomplete" in err[0], err


@pytest.fixture(scope="module")
def loopvae_run(tmp_path_factory):
    """The folder of a 1-step LoopVAE run (3 scales) at 32 px on synthetic images."""
    out = tmp_path_factory.mktemp("loopvae") / "o"
    assert train_loopvae.cli(["--model", "loopvae", "--embed-dim", "32", "--num-blocks", "1", "--latent-dim", "4", "--data",
                      "synthetic", "--device", "cpu", "--workers", "0", "--val-subset", "4", "--eval-batch-size", "4",
                      "--batch-size", "4", "--max-steps", "1", "--epochs", "1", "--out-dir", str(out)]) == 0
    return out


def test_a_tokenizer_evaluated_at_a_size_it_cannot_take_is_the_line_training_gives(loopvae_run, tmp_path, capsys):
    """LoopVAE (3 scales: sizes divisible by 8) --eval-only --img-size 36 or 30: a ValueError traceback in
    the first batch; now the line a training run at that size gets. 40 still evaluates."""
    out = loopvae_run
    for size in (36, 30):
        capsys.readouterr()
        assert train_loopvae.cli(["--eval-only", "--resume", str(out), "--img-size", str(size), "--out-dir",
                                  str(tmp_path / f"ev{size}")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"train_loopvae.py: error: img_size {size} is not divisible by 2^3 (one halving per scale)"], err
    assert train_loopvae.cli(["--eval-only", "--resume", str(out), "--img-size", "40", "--out-dir",
                              str(tmp_path / "ev40")]) == 0
    assert json.load(open(tmp_path / "ev40" / "reconstruction_eval.json"))["img_size"] == 40


def test_a_loopvae_checkpoint_where_a_classifier_is_needed_is_named_as_a_tokenizer(loopvae_run, tmp_path, capsys):
    """train.py --teacher called a LoopVAE checkpoint "neither an rvits checkpoint nor a ViT state dict" (the
    lab's readers: lab/tests/test_lab_failures.py)."""
    said = ": a --model loopvae checkpoint, a tokenizer"
    assert train.cli(SYNTH + ["--teacher", str(loopvae_run), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"train.py: error: --teacher {loopvae_run / 'ckpt.pt'}{said} (it reconstructs images: no class head, "
                   "no patch tokens; train_loopvae.py trains it); give a classifier's checkpoint or timm ViT weights"], err
    for argv in (["--eval-only", "--resume", str(loopvae_run)], ["--resume", str(loopvae_run)],
                 ["--finetune", str(loopvae_run)], ["--model", "loopvae"]):  # train.py trains classifiers: the line
        # names the script
        assert train.cli(argv + ["--out-dir", str(tmp_path / "t")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("a --model loopvae checkpoint, not a classifier one; train_loopvae.py trains" in err[0]
                                  or "--model loopvae: train.py does not train it; train_loopvae.py does" in err[0]), err


# ----------------------------------------------------------------------------- a checkpoint with a flipped bit (issue 62)
def flip_a_bit(src, dst, record="archive/data/0"):
    """Copy the checkpoint `src` to `dst` with one bit of `record`'s bytes flipped (the first tensor of its
    first entry, the model's); returns the record's name as the zip holds it."""
    import zipfile
    blob = bytearray(open(src, "rb").read())
    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(record))
    name_len, extra_len = (int.from_bytes(blob[info.header_offset + k:info.header_offset + k + 2], "little")
                           for k in (26, 28))  # the local header's name and extra-field lengths
    blob[info.header_offset + 30 + name_len + extra_len + 3] ^= 0x40  # a float32's exponent bit
    open(dst, "wb").write(bytes(blob))
    return info.filename


def test_a_checkpoint_with_one_flipped_bit_is_refused_by_every_reader_naming_the_record(tmp_path, capsys):
    """torch.load skips the zip's CRC-32: --resume trained on from a weight changed by orders of magnitude and
    said nothing. Every load goes through weights.read_weights, which checks the CRC-32 of every record first:
    --resume, --eval-only, --finetune and --teacher each refuse the file in one line naming it and the record, exit
    status 2 (the lab's analyze.py and probe.py: lab/tests/test_lab_failures.py)."""
    good = tmp_path / "run"
    assert train.cli(SYNTH + ["--max-steps", "1", "--out-dir", str(good)]) == 0
    bad = tmp_path / "flipped" / "ckpt.pt"
    os.makedirs(bad.parent)
    record = flip_a_bit(good / "ckpt.pt", bad)
    a, b = load(good / "ckpt.pt")["model"], load(bad)["model"]  # torch.load alone: no error, another weight
    assert [k for k in a if not torch.equal(a[k], b[k])] == [next(iter(a))]
    capsys.readouterr()
    said = f"{bad}: corrupt, its record {record} (a tensor's bytes) fails the zip's CRC-32 check"
    out = ["--out-dir", str(tmp_path / "o")]
    for tool, flag, argv in [(train, "--resume", SYNTH + ["--resume", str(bad)] + out),
                             (train, "--resume", ["--eval-only", "--resume", str(bad), "--device", "cpu"] + out),
                             (train, "--finetune", SYNTH + ["--finetune", str(bad)] + out),
                             (train, "--teacher", SYNTH + ["--teacher", str(bad)] + out)]:
        assert tool.cli(argv) == 2, (tool, argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"{tool.__name__}.py: error: {flag} {said}"), (argv, err)
    assert not os.path.exists(tmp_path / "o" / "ckpt.pt")


# ----------------------------------------------------------------------------- a stdout that fills (issue 62)
class FullDisk(io.StringIO):
    """A stream on a file system that fills: its `after`-th write and every one after it raise ENOSPC."""

    def __init__(self, after):
        super().__init__()
        self.after, self.writes = after, 0

    def write(self, text):
        self.writes += 1
        if self.writes >= self.after:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


def test_a_stdout_on_a_full_disk_ends_nothing(tmp_path, capsys, monkeypatch):
    """`python train.py ... > train.log` on a file system that fills: an OSError traceback from a print in the
    loop ended the run. Now the run goes on and ends as it would have (its epoch logged, the last checkpoint,
    status 0), and one line on stderr says so, once. (stderr that fails: tests/test_cluster.py, SIGHUP.)"""
    full = FullDisk(after=4)
    monkeypatch.setattr(sys, "stdout", full)
    out = tmp_path / "run"
    assert train.cli(SYNTH + ["--out-dir", str(out)]) == 0
    assert full.writes == 4  # (it failed in the set-up's second line, was given up, and the run went on)
    assert load(out / "ckpt.pt")["step"] == 4
    assert [json.loads(ln)["step"] for ln in open(out / "log.jsonl")] == [4]  # the epoch, evaluated and logged
    said = [ln for ln in capsys.readouterr().err.splitlines() if "stdout" in ln]
    assert said == ["train.py: writing to stdout failed (No space left on device); it goes on without printing "
                    "there"], said


def test_a_run_printing_to_dev_full_trains_to_the_end_and_exits_0(tmp_path):
    """The same with a real full device (Linux's /dev/full: every write is ENOSPC) and a real process: the
    interpreter's own flush of stdout at exit, which fails there, no longer turns the status into 120."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd(SYNTH + ["--max-steps", "2", "--out-dir", str(tmp_path / "run")]), stdout=full,
                           stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.count("writing to stdout failed (No space left on device)") == 1
    assert load(tmp_path / "run" / "ckpt.pt")["step"] == 2
