"""Summarize the papers' claims never tested before (lab/claims.py, study "untested"): Training Crossroads'
black-box field and solver gains, bViT's width trend, each judged by the one rule on fresh runs; RUNS/summary.md.

    OUT=runs/untested ARMS=untested SEEDS="0 1 2" bash lab/reproduce_mini.sh
    python lab/summarize_untested.py runs/untested [--results lab/docs/results.md] [--no-measure] [--num-images N]
    python lab/summarize_untested.py lab/results/untested        # the kept runs: only what they cached
    python lab/summarize_untested.py runs/untested runs/seed2  # several folders read as one (partners elsewhere)

Reads RUNS/ARM/seed<k>/ of the claims' arms (finished runs: done.json): the top-1 of the last epoch of log.jsonl
(the trained depth). A claim's arm may be a contrast "X - Y" (claims.CONTRAST): per seed, X's top-1 minus Y's. Its
pairs are the seeds every arm it names ran (by seed number), made no earlier than the claim's registration
(claims.older); verdict and interval through claims.judge, widened where a seed's runs ran on two CPU models.
The mechanism signatures are measured on the way, cached in each run's folder (a second call only reads):
`analyze.py --resume RUN/ckpt.pt --out-dir RUN` writes steps.json (the token norm per step) and cka.json (self-CKA
between steps). A claim whose signature fails reads "not engaged at this scale"; one whose signature has neither
cache nor checkpoint (a kept run, or --no-measure) gets " (signature not measured)".
--results writes the claims and the arms' table between the <!-- untested-claims --> markers.
"""
import dataclasses
import functools
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims as registry  # noqa: E402
from summarize_mini import RULE, finished_runs, fmt, study_runs, table, write_blocks  # noqa: E402

CLAIMS = registry.claims_of("untested")


def names(claim):
    """The arms a claim's scores read: each side of its contrasts ("X - Y": X and Y), in order."""
    return list(dict.fromkeys(n for side in (claim.a, claim.b) for n in side.split(registry.CONTRAST)))


ARMS = list(dict.fromkeys(n for c in CLAIMS for n in names(c)))
COMMAND = 'OUT=runs/untested ARMS=untested SEEDS="0 1 2" bash lab/reproduce_mini.sh'
BLACKBOX, SUBTRACTED = "odevit-blackbox", "odevit-euler"
# Which signature each claim reads (their `signature` text; "as crossroads-blackbox-costs" is the same one).
SIGNATURES = {"crossroads-blackbox-costs": "norm growth", "crossroads-blackbox-costs-few": "norm growth",
              "bvit-width-trend-mini": "self-CKA"}


def fail(msg):
    sys.stderr.write(f"summarize_untested.py: error: {msg}\n")
    sys.exit(2)


# ----------------------------------------------------------------------------- the signatures (pure)
def norm_growth(steps, first=1, last=8):
    """How much the token norm grows from step `first` to step `last`, relative to its size at `first`:
    act_norm(last) / act_norm(first) - 1 (relative, so that two arms' token scales compare). steps: analyze.py's
    steps.json, {"steps": [{"step": k, "act_norm": mean token L2 norm after step k, ...}, ...]} with k from 1.
    None when either step is absent (a model run at fewer steps)."""
    norm = {row["step"]: row["act_norm"] for row in steps["steps"]}
    if first not in norm or last not in norm:
        return None
    return norm[last] / norm[first] - 1


def blackbox_engaged(blackbox, subtracted, factor=2.0):
    """crossroads-blackbox-costs' signature: the black-box field's token norm grows from step 1 to step 8 at least
    `factor` (the claim's 2x) as much as the state-subtracted field's, each growth (norm_growth) the mean over
    seeds. blackbox, subtracted: the per-seed steps.json of the two arms (None where not measured). Returns
    (holds: True, False, or None when a seed is not measured, the two mean growths or None)."""
    growths = [[norm_growth(s) if s else None for s in arm] for arm in (blackbox, subtracted)]
    if not blackbox or any(g is None for arm in growths for g in arm):
        return None, None
    mb, ms = (statistics.mean(arm) for arm in growths)
    return mb >= factor * ms, (mb, ms)


def self_cka(cka, first=1, last=8):
    """The linear CKA of step `first` and step `last` in analyze.py's cka.json: {"layers": ["embed", "step 1",
    ..., "step L"], "cka": the (L + 1) x (L + 1) matrix over those layers}. None when undefined (null: a constant
    representation) or when the model ran fewer steps."""
    layers = cka["layers"]
    if f"step {first}" not in layers or f"step {last}" not in layers:
        return None
    return cka["cka"][layers.index(f"step {first}")][layers.index(f"step {last}")]


def width_engaged(per_arm, below=0.9):
    """bvit-width-trend-mini's signature: the shared block acts differently across steps, the self-CKA of step 1
    and step 8 (self_cka) below `below` (the claim's 0.9) for each bViT arm, the mean over its seeds. per_arm:
    {bViT arm: its per-seed cka.json (None where not measured)}. Returns (holds: True, False, or None when a seed
    is not measured, {arm: mean CKA} or None)."""
    ckas = {arm: [self_cka(c) if c else None for c in cs] for arm, cs in per_arm.items()}
    if not all(ckas.values()) or any(x is None for cs in ckas.values() for x in cs):
        return None, None
    means = {arm: statistics.mean(cs) for arm, cs in ckas.items()}
    return all(m < below for m in means.values()), means


def signature_arms(claim):
    """The arms whose analyze.py files the claim's signature reads (none without a signature)."""
    kind = SIGNATURES.get(claim.key)
    if kind == "norm growth":
        return [BLACKBOX, SUBTRACTED]
    return [n for n in names(claim) if n.startswith("bvit")] if kind == "self-CKA" else []


def signature(claim, by_seed, seeds):
    """(holds: True, False or None (not measured), the measured values in words) of the claim's signature on
    the runs of `seeds` (by_seed: arm -> seed -> run); (True, "") for a claim without one."""
    kind = SIGNATURES.get(claim.key)
    read = {arm: [by_seed[arm][s].get("steps" if kind == "norm growth" else "cka") for s in seeds]
            for arm in signature_arms(claim)}
    if kind == "norm growth":
        holds, growth = blackbox_engaged(read[BLACKBOX], read[SUBTRACTED])
        return holds, "" if growth is None else f"norm growth 1-8: {growth[0]:+.2f} vs {growth[1]:+.2f} (>= 2x)"
    if kind == "self-CKA":
        holds, means = width_engaged(read)
        return holds, "" if means is None else "CKA(1, 8): " + ", ".join(f"{a} {m:.2f}" for a, m in means.items()) + " (< 0.9)"
    return True, ""


# ----------------------------------------------------------------------------- runs, measures, verdicts
def load_runs(root):
    """{arm: [{seed, dir, cpu, last (the last epoch's log record), done, args, steps, cka}]} of the finished runs
    of ARMS (steps and cka: analyze.py's cached JSON, where measured)."""
    return finished_runs(root, ARMS, {"done": "done.json", "args": "args.json", "steps": "steps.json", "cka": "cka.json"})


def measure(runs, num_images, data_dir=None):
    """Run analyze.py on every run a signature reads that lacks steps.json or cka.json and still has its
    checkpoint (a kept run has none: it stays unmeasured); both are cached in the run's folder."""
    import analyze
    for arm in dict.fromkeys(a for c in CLAIMS for a in signature_arms(c)):
        for r in runs.get(arm, []):
            ckpt = os.path.join(r["dir"], "ckpt.pt")
            if ("steps" in r and "cka" in r) or not os.path.isfile(ckpt):
                continue
            print(f"analyze.py: {arm} seed {r['seed']}", flush=True)
            extra = ["--data-dir", data_dir] if data_dir else []
            if analyze.cli(["--resume", ckpt, "--out-dir", r["dir"], "--num-images", str(num_images), *extra]):
                fail(f"analyze.py failed on {ckpt}")
            for key in ("steps", "cka"):
                with open(os.path.join(r["dir"], f"{key}.json")) as f:
                    r[key] = json.load(f)


older = functools.cache(registry.older)  # (its git calls once per commit, not once per run and claim)


def fresh(run, claim):
    """Whether the run was made no earlier than the claim's registration (claims.older on done.json's commit and date)."""
    done = run.get("done", {})
    return not older(done.get("commit", "?"), done.get("commit_date", "?"), claim.registered)


def judged(arm, run):
    """Whether some claim reading `arm` may judge the run (fresh for it): the runs of the arms' table."""
    return any(fresh(run, c) for c in CLAIMS if arm in names(c))


def side_cpu(side, by_seed, seed):
    """The CPU model of one side of a claim (an arm, or a contrast's two runs) at `seed`: None (a pair the rule
    widens) when the side's runs ran on two models or one is not recorded."""
    cpus = {by_seed[n][seed].get("cpu") for n in side.split(registry.CONTRAST)}
    return cpus.pop() if len(cpus) == 1 else None


def judge(claim, runs):
    """(a's per-seed scores, b's, mean difference, half-width, verdict in words, the signature in words) of one
    claim: the seeds every arm of it ran, fresh, paired by seed number; claims.judge, its signature as the gate."""
    by_seed = {n: {r["seed"]: r for r in runs.get(n, []) if "val_acc1" in r["last"] and fresh(r, claim)}
               for n in names(claim)}
    seeds = sorted(set.intersection(*(set(rs) for rs in by_seed.values())))
    scores = {n: [by_seed[n][s]["last"]["val_acc1"] for s in seeds] for n in by_seed}
    a, b = registry.paired(claim.a, scores), registry.paired(claim.b, scores)
    cpus = [(side_cpu(claim.a, by_seed, s), side_cpu(claim.b, by_seed, s)) for s in seeds]
    holds, said = signature(claim, by_seed, seeds) if seeds else (True, "")
    gated = dataclasses.replace(claim, gate=(("signature", ">=", 1),))  # claims.judge's words for a failed or missing one
    mean, half, v = registry.judge(gated, a, b, cpus, {} if holds is None else {"signature": int(holds)})
    return a, b, mean, half, v, said


def want(claim):
    """The claim's kind in words, on a - b."""
    if claim.kind == ">":
        return "a > b"
    words = {"<=": "a - b <= {:g}", "~": "a - b within ±{:g}", registry.NOT_WITHIN: "a - b beyond ±{:g}"}
    return words[claim.kind].format(claim.margin)


def claims_block(runs):
    """One row per claim: its words, arms and kind, the paired scores, the half-width, the signature, the verdict."""
    rows = []
    for c in CLAIMS:
        a, b, mean, half, v, said = judge(c, runs)
        here = "" if mean is None else f"{fmt(a)} vs {fmt(b)} ({mean:+.2f}, {len(a)} seed{'s' if len(a) > 1 else ''})"
        resolves = "" if half is None or half == float("inf") else f"{half:.2f}"
        rows.append([f"{c.key}: \"{c.words}\" ({c.paper}, {c.where})", f"`{c.a}` vs `{c.b}`", f"top-1, {want(c)}",
                     here, resolves, said, v])
    return table(["claim", "a vs b", "score, kind", "here (mean ± half the spread)", "resolves (points)",
                  "signature", "verdict"], rows)


def arms_table(runs):
    """Per arm, of its runs fresh for the claims (judged): the seeds, the last epoch's top-1 (mean ± half the
    spread) and the signatures' measures cached."""
    rows = []
    for arm in ARMS:
        rs = [r for r in runs.get(arm, []) if judged(arm, r)]
        if not rs:
            continue
        growth = [norm_growth(r["steps"]) for r in rs if "steps" in r]
        cka = [self_cka(r["cka"]) for r in rs if "cka" in r]
        rows.append([f"`{arm}`", " ".join(str(r["seed"]) for r in rs),
                     fmt([r["last"]["val_acc1"] for r in rs if "val_acc1" in r["last"]]),
                     fmt(growth) if growth and None not in growth else "", fmt(cka) if cka and None not in cka else ""])
    return table(["arm", "seeds", "top-1 (%)", "token norm growth, step 1 to 8", "self-CKA, step 1 vs 8"], rows)


def blocks(runs):
    """The text between the <!-- untested-claims --> markers: the claims, the rule's words, the runs left out for
    being older than the claims, and (with runs) the arms' table."""
    left = sorted(f"{arm} seed {r['seed']}" for arm, rs in runs.items() for r in rs if not judged(arm, r))
    notes = [RULE.format(hw=registry.HARDWARE_NOISE), "Contrasts \"X - Y\": per seed, X's top-1 minus Y's, paired by "
             "seed number; signatures from analyze.py's steps.json and cka.json (lab/summarize_untested.py)."]
    if left:
        notes.append(f"Left out, made before the claims' registration: {', '.join(left)}.")
    return claims_block(runs) + "\n\n" + " ".join(notes) + ("\n\n" + arms_table(runs) if runs else "")


def read(roots):
    """The finished runs of the claims' arms in the folders `roots`, read as one ({arm: [run]}, load_runs' records;
    a seed's partner may lie in another study's folder). One run per arm and seed: of runs of the same arm and seed
    in several folders (a partner kept with both studies), the first a claim may judge (judged), else the first.
    Exits 2 with one line for a folder that is not a study or a run's file that does not parse."""
    runs = {}
    for root in roots:
        try:
            for arm, rs in study_runs(root, load_runs, ARMS, COMMAND, "summarize_untested.py").items():
                runs.setdefault(arm, []).extend(rs)
        except ValueError as e:  # a damaged JSON file of a run
            fail(f"{root}: a run's file does not parse ({e})")
    for arm, rs in runs.items():
        pick = {}
        for r in sorted(rs, key=lambda r: not judged(arm, r)):  # stable: folder order among equals
            pick.setdefault(r["seed"], r)
        runs[arm] = [pick[s] for s in sorted(pick)]
    return runs


def main(argv=None):
    from training import flags  # (the number types and one-line errors of every tool)
    cli = flags.Parser(prog="summarize_untested.py", description=__doc__.split("\n\n")[0])
    cli.add_argument("runs", nargs="*", default=["runs/untested"], help="run folders, read as one (a seed's partner "
                     "runs may lie in another study's folder); summary.md goes to the first")
    cli.add_argument("--results", metavar="FILE", help="write the claims and the arms' table between this file's "
                     "<!-- untested-claims --> markers (lab/docs/results.md)")
    cli.add_argument("--no-measure", action="store_true", help="only read what is cached")
    cli.add_argument("--num-images", type=flags.positive(int), default=512, help="analyze.py --num-images")
    cli.add_argument("--data-dir", help="analyze.py --data-dir (default: each checkpoint's)")
    a = cli.parse_args(argv)
    if a.results and not os.path.isfile(a.results):
        fail(f"--results {a.results}: no such file")
    runs = read(a.runs)
    short = sorted(f"{arm} seed {r['seed']}" for arm, rs in runs.items() for r in rs
                   if r.get("args", {}).get("max_steps") or r.get("args", {}).get("val_subset"))
    if a.results and short:
        fail(f"--results: {', '.join(short[:3])} ran shortened (--max-steps/--val-subset), not the protocol")
    if not a.no_measure:
        measure(runs, a.num_images, a.data_dir)
    text = blocks(runs)
    with open(os.path.join(a.runs[0], "summary.md"), "w") as f:
        f.write("# The papers' claims never tested before\n\n" + text + "\n")
    if a.results:
        write_blocks(a.results, {"untested-claims": text}, a.runs[0], prefix="untested", tool="summarize_untested.py",
                     figures=())
    print(text)


if __name__ == "__main__":
    main()
