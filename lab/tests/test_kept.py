"""The kept runs, compact (issue 78, item 3): a study's runs are one text file, lab/results/STUDY/runs.jsonl (a JSON
line per run), that lab/kept.py unpacks into the folders the summarizers read, byte for byte. Every table of the
results page comes back from the compact files as the page holds it (here: fig2's; the others
beside their summarizers' tests: mini-table, mini-verdicts and moe-table, anytime, teacher-claims and the LoopVAE
tables in test_reproduce.py, untested-claims in test_untested_claims.py, README's headlines in test_claims.py)."""
import json
import os

import claims
import kept

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "lab", "docs", "results.md")


def marked(text, name):
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


def files_under(folder, skip_png=False):
    """{path under `folder`: its bytes} of every file."""
    out = {}
    for here, _, names in os.walk(folder):
        for n in names:
            if not (skip_png and n.endswith(".png") and here != folder):
                p = os.path.join(here, n)
                out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


def test_unpack_of_pack_is_the_folder_byte_for_byte_without_the_runs_figures(tmp_path):
    study = tmp_path / "study"
    for arm, seed in (("vit", 0), ("vit", 1), ("bvit-ds", 10)):
        d = study / arm / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "done.json").write_text(json.dumps({"commit": "abc1234", "commit_date": "2026-12-01 10:00", "cpu": "X"}))
        (d / "args.json").write_text(json.dumps({"model": arm, "seed": seed}, indent=1))
        (d / "log.jsonl").write_text('{"step": 1, "loss": 4.605170249938965}\n{"epoch": 0, "val_acc1": 1.25}\n')
        (d / "model.txt").write_text("bvit: 0.230 M params, 0.011 GFLOPs/img, depth 6 \u00d7 1 block\n")
        (d / "depth_eval.png").write_bytes(b"\x89PNG\r\n")  # a run's figure: not kept
    (study / "vit" / "seed2").mkdir()  # unfinished: no done.json, nothing else either
    (study / "old").mkdir()
    (study / "old" / "global_seed0_log.json").write_text("[1, 2]")  # a study's older layout: a line of its own
    (study / "summary.md").write_text("# the study\n")
    lines = kept.pack(str(study))
    assert [ln["dir"] for ln in lines] == ["bvit-ds/seed10", "old", "vit/seed0", "vit/seed1"]
    assert (lines[0]["arm"], lines[0]["seed"], lines[0]["commit"], lines[0]["date"], lines[0]["cpu"]) == (
        "bvit-ds", 10, "abc1234", "2026-12-01 10:00", "X")
    assert "arm" not in lines[1]
    packed = tmp_path / "packed"
    packed.mkdir()
    kept.write(lines, str(packed / "runs.jsonl"))
    (packed / "summary.md").write_text("# the study\n")
    assert len((packed / "runs.jsonl").read_text().splitlines()) == 4
    back = kept.unpack(str(packed), str(tmp_path / "back"))
    assert files_under(back) == {k: v for k, v in files_under(str(study)).items() if not k.endswith(".png")}
    added = kept.keep(str(study), str(tmp_path / "again"))  # keep_results's path: the finished runs only
    assert [ln["dir"] for ln in added] == ["bvit-ds/seed10", "vit/seed0", "vit/seed1"]


def test_a_study_without_kept_runs_has_none():
    """claims.KEPT["replication"] runs later: no folder, or no runs.jsonl, is no run, not an error."""
    assert kept.read(os.path.join(ROOT, "lab", "results", "nosuch")) == []
    assert claims.kept_runs("replication", root=ROOT) == [] or all(
        len(r) == 4 for r in claims.kept_runs("replication", root=ROOT))


def test_every_kept_study_packs_back_to_its_own_file(tmp_path):
    """Each committed runs.jsonl is what pack() writes for its unpacked folders: one format, no drift."""
    studies = sorted(d for d in os.listdir(os.path.join(ROOT, "lab", "results"))
                     if os.path.isfile(os.path.join(ROOT, "lab", "results", d, "runs.jsonl")))
    assert {"mini", "init", "revit", "revit-teacher", "loopvae", "revit-fig2", "untested"} <= set(studies)
    for s in studies:
        src = os.path.join(ROOT, "lab", "results", s)
        back = kept.unpack(src, str(tmp_path / s))
        kept.write(kept.pack(back), str(tmp_path / f"{s}.jsonl"))
        assert (tmp_path / f"{s}.jsonl").read_bytes() == open(os.path.join(src, "runs.jsonl"), "rb").read(), s
    assert len(claims.kept_runs("mini")) == 33 and len(claims.kept_runs("untested")) == 28


def test_the_fig2_table_is_what_the_kept_runs_give(tmp_path):
    """(The GPU study's runs were one line each before: lab/results/gpu/results.jsonl, unchanged.)"""
    import summarize_fig2
    page = open(RESULTS, encoding="utf-8").read()
    fig2 = kept.unpack(os.path.join(ROOT, "lab", "results", "revit-fig2"), str(tmp_path / "revit-fig2"))
    assert marked(page, "fig2-claims") == summarize_fig2.blocks(summarize_fig2.load_runs(fig2)).strip()


def test_every_table_of_the_results_page_has_a_test_that_rebuilds_it():
    names = {line.split()[1] for line in open(RESULTS, encoding="utf-8") if line.startswith("<!-- ") and "/" not in line}
    assert names == {"gpu-table", "gpu-verdicts", "mini-table", "mini-verdicts", "anytime", "teacher-claims",
                     "fig2-claims", "untested-claims", "loopvae-claims",
                     "replication", "timeline",  # (these two: lab/tests/test_claims.py, lab/headlines.py --results)
                     "anytime-policy"}


def test_the_exit_policy_table_is_what_the_kept_runs_give():
    import summarize_anytime_policy
    runs = summarize_anytime_policy.load_runs(os.path.join(ROOT, "lab", "results", "anytime-policy"))
    assert marked(open(RESULTS, encoding="utf-8").read(), "anytime-policy") == summarize_anytime_policy.blocks(runs).strip()


def test_every_kept_runs_args_json_loads(tmp_path):
    """The kept runs' args.json (some from before flags were cut or changed their defaults) load as train.py
    --config files: the file of any kept run starts it again. They recorded their study arm as "preset"
    (c100-mini-..., a preset until issue 78: now an arm of lab/arms.py); arms.kept_config drops that name."""
    import arms
    from loopvae_train import flags as lvflags
    from training import flags
    lines = [ln for s in os.listdir(os.path.join(ROOT, "lab", "results"))
             for ln in kept.read(os.path.join(ROOT, "lab", "results", s)) if "args.json" in ln["files"]]
    assert len(lines) > 100
    for i, ln in enumerate(lines):
        args = arms.kept_config(json.loads(ln["files"]["args.json"]))
        (tmp_path / f"{i}.json").write_text(json.dumps(args))  # (LoopVAE's runs: train_loopvae.py's flags)
        flags.resolved(["--config", str(tmp_path / f"{i}.json")],
                       entry=lvflags.ENTRY if args.get("model") == "loopvae" else None)
