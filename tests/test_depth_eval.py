"""--eval-depths (issue 62, item 6): `--eval-depths 6,6,100000` on reViT evaluated depth 6 twice, then asked
26 GB and ended in a traceback without depth_eval.json. A depth beyond the stated limit is refused in one line
before training, a depth given twice is evaluated once (and the run says so), and depth_eval.json holds each
finished depth before the next starts, so that a failure at depth k keeps the depths before it."""
import json
import os

import pytest

import train
from training import evaluation, flags
from test_train import TINY

SYNTH = TINY + ["--data", "synthetic", "--max-steps", "2", "--epochs", "1"]  # (TINY: depth 2)


@pytest.mark.parametrize("model", ["revit", "bvit", "srvit", "odevit"])
def test_a_depth_beyond_the_limit_is_refused_in_one_line_before_anything_runs(model, tmp_path, capsys):
    """The limit is EVAL_DEPTH_LIMIT x the trained depth in the model's unit (srvit: recursions, 4 here);
    the limit itself is allowed, one more is refused by the configuration alone (no folder, no data read)."""
    args = flags.resolved(["--model", model, "--depth", "2", "--eval-depths", "1"])
    most = evaluation.EVAL_DEPTH_LIMIT * (args.recursions if model == "srvit" else 2)
    assert flags.resolved(["--model", model, "--depth", "2", "--eval-depths", f"1,{most}"]).eval_depths == [1, most]
    out = tmp_path / "out"
    capsys.readouterr()
    assert train.cli(SYNTH + ["--model", model, "--eval-depths", f"6,6,{most + 1}", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"train.py: error: --eval-depths {most + 1}: at most "
                                                   f"{evaluation.EVAL_DEPTH_LIMIT}x the trained depth"), err
    assert not out.exists()


def test_each_depth_is_evaluated_once_and_kept_before_the_next(tmp_path, monkeypatch, capsys):
    """--eval-depths 1,1,3,4 on a run of depth 2: depth 1 once (a note says so); depth 4 runs out of memory
    (the CPU allocator's error, raised here): one line naming it, and depth_eval.json holds depths 1 and 3."""
    evaluate = evaluation.evaluate

    def short_of_memory(*args, depth=None, **kwargs):
        if depth == 4:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                               "tried to allocate 26000000000 bytes")
        return evaluate(*args, depth=depth, **kwargs)
    monkeypatch.setattr(evaluation, "evaluate", short_of_memory)
    out = tmp_path / "out"
    capsys.readouterr()
    assert train.cli(SYNTH + ["--model", "revit", "--eval-depths", "1,1,3,4", "--out-dir", str(out)]) == 2
    said = capsys.readouterr()
    assert "note: --eval-depths gives depth 1 more than once: each depth is evaluated once" in said.out.splitlines()
    assert said.out.count("evaluating at depth 1 ") == 1
    assert said.err.splitlines() == ["train.py: error: --eval-depths 4: out of memory ([enforce fail at alloc_cpu.cpp:127] "
                                     "DefaultCPUAllocator: can't allocate memory: you tried to allocate 26000000000 "
                                     "bytes); depths 1, 3 are in depth_eval.json; give smaller depths, or a smaller "
                                     "--eval-batch-size"], said.err
    res = json.loads((out / "depth_eval.json").read_text())
    assert [r["depth"] for r in res["results"]] == [1, 3] and res["trained_depth"] == 2
    logged = [json.loads(ln)["depth"] for ln in (out / "log.jsonl").read_text().splitlines() if '"depth"' in ln]
    assert logged == [1, 3]
    assert os.path.exists(out / "ckpt.pt")  # (the trained weights, untouched)
