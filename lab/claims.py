"""The one registry of the claims rvits tests (CLAIMS) and the one rule that judges them (verdict).

A claim is registered here before the runs that judge it: in its paper's words, with where the paper
says it, its two arms, its kind, its margin and why, its seeds, the measured signature that its
mechanism is at work, and the date and commit it was registered at. Every summarizer of lab/
reads its claims from here.

Kinds (a and b: the per-seed scores, in points, of two arms paired by seed):
    ">"   a beats b.
    "<="  a does not beat b by more than `margin`.
    "~"   a and b lie within `margin` of each other.
The rule (verdict): a two-sided 90 % Student t-interval on the paired differences a_i - b_i (n >= 2 pairs,
n - 1 degrees of freedom), widened by the measured difference of the same run on two CPU models when
the pairs ran on different ones (or by a known noise the seeds do not show: a readout's sampling error over the
same images). ">": agree when the interval lies above 0, disagree when below 0.
"<=": agree when it lies below +margin, disagree when above it. "~": agree when it lies inside
+-margin, disagree when wholly outside. Else (and with fewer than 2 pairs) "cannot tell".
Standard library only.
"""
import json
import math
import os
import statistics
import subprocess
from dataclasses import dataclass

KINDS = (">", "<=", "~")


@dataclass(frozen=True)
class Claim:
    """One registered claim.

    key: short unique id ("crossroads-matched-flops"). paper: "Training Crossroads", "bViT", "reViT",
    "SoftMoR", "structured init", "LoopVAE" or "ours" (a claim of this project, not a paper's).
    where: where the paper says it ("abstract", "section 4.4, Fig. 2"). words: the paper's words.
    study: the results it is judged on ("mini", "revit", "teacher", "fig2", "gpu", "init", "loopvae",
    "anytime"). a, b: the two arms; depth: evaluation depth relative to the trained depth (1: trained).
    kind: one of KINDS; margin: points, for "<=" and "~" (None for ">"); why_margin: why that margin
    (the paper's own resolution). seeds: paired seeds the verdict needs. signature: the measured sign
    that the mechanism is at work, with its threshold, or None where there is no mechanism to gate on.
    registered: "YYYY-MM-DD HH:MM commit" (UTC; the commit that first wrote the claim). exploratory:
    registered after runs it judges (stands apart). metric: the score ("top-1", "linear probe top-1",
    "mosaic mIoU", ...). depth_b: b's evaluation depth when it differs from a's (a claim about one arm at
    two depths). gate: ((log.jsonl key, ">=" or "<=", threshold), ...), the signature's thresholds on the
    last epoch (signals(), engaged()) of arm `gated` (default: a); empty when the signature is read by hand or
    there is none. fresh_seeds: the seeds it is judged on, named before any of their runs and never run before
    for its arms (the replication, below); empty: the first `seeds` seeds of its study. misregistered: why the
    claim's kind or words are not what the paper says (kept, labelled, judged as registered).
    """
    key: str
    paper: str
    where: str
    words: str
    study: str
    a: str
    b: str
    depth: float
    kind: str
    margin: float | None
    why_margin: str
    seeds: int
    signature: str | None
    registered: str
    exploratory: bool = False
    metric: str = "top-1"
    depth_b: float | None = None
    gate: tuple = ()
    gated: str | None = None
    fresh_seeds: tuple = ()
    misregistered: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.key}: kind {self.kind!r} is not one of {KINDS}")
        if (self.margin is None) != (self.kind == ">"):
            raise ValueError(f"claim {self.key}: kind {self.kind!r} {'takes no' if self.kind == '>' else 'needs a'} margin")


# Two-sided 90 % Student t quantiles t_{0.95, df} (df = pairs - 1); beyond the table, the normal's 1.645.
T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
       1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)
# The same run (c100-mini-srvit-r1, seed 0, code of commit 7cace80, one thread) on two CPU models: top-1 %.
# Other CPUs round differently (other SIMD kernels), and 3,900 steps carry the difference as far as a new
# seed would (lab/docs/results.md, "CIFAR-100 at CPU scale"): what a pair on different CPU models is widened by.
CROSS_CPU = {"AMD EPYC (CPU-2, 2026-11-30)": 28.12, "Intel Xeon (2026-12-01, measured twice)": 29.77}
HARDWARE_NOISE = max(CROSS_CPU.values()) - min(CROSS_CPU.values())


def interval(a, b, cpus=None, widen=0.0):
    """(mean, half-width) of the two-sided 90 % t-interval on the paired differences a_i - b_i; the
    half-width is also the smallest difference these seeds resolve. a, b: per-seed scores, paired by
    seed (same length). cpus: per pair, (CPU model of a's run, of b's run); a pair on two models (or an
    unknown one, None) widens the interval by HARDWARE_NOISE; `widen`: a known noise the seeds do not show,
    added to the half-width (a readout's sampling error over the same images). Fewer than 2 pairs: half-width inf.
    Raises ValueError for unpaired lists."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        return (d[0] if d else 0.0), math.inf
    t = T90[len(d) - 2] if len(d) - 1 <= len(T90) else 1.645
    half = t * statistics.stdev(d) / math.sqrt(len(d))
    if cpus and any(x is None or y is None or x != y for x, y in cpus):
        half += HARDWARE_NOISE
    return statistics.mean(d), half + widen


def verdict(kind, margin, a, b, cpus=None, widen=0.0):
    """"agree", "disagree" or "cannot tell" for a claim of `kind` (KINDS) with `margin` (points; None for
    ">") on the per-seed scores a, b paired by seed, from interval(a, b, cpus) (module docstring). Raises
    ValueError for an unknown kind, a missing margin or unpaired lists."""
    if kind not in KINDS + ("!~",):
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if kind != ">" and (margin is None or margin <= 0):
        raise ValueError(f"kind {kind!r} needs a margin > 0, got {margin}")
    if kind == "!~":  # (issue 64's kind, below) the mirror of "~": agree where "~" disagrees and the reverse
        within = verdict("~", margin, a, b, cpus, widen)
        return {"agree": "disagree", "disagree": "agree"}.get(within, within)
    mean, half = interval(a, b, cpus, widen)
    lo, hi = mean - half, mean + half
    if kind == ">":
        return "agree" if lo > 0 else "disagree" if hi < 0 else "cannot tell"
    if kind == "<=":
        return "agree" if hi < margin else "disagree" if lo > margin else "cannot tell"
    return "agree" if -margin < lo and hi < margin else "disagree" if lo > margin or hi < -margin else "cannot tell"


# Where each study's kept runs are (lab/results/, lab/keep_results.py): study -> its folder, whose runs.jsonl holds a
# line per run (lab/kept.py), or a GPU study's results.jsonl.
KEPT = {"mini": "lab/results/mini", "anytime": "lab/results/mini", "init": "lab/results/init", "revit": "lab/results/revit",
        "teacher": "lab/results/revit-teacher", "loopvae": "lab/results/loopvae", "fig2": "lab/results/revit-fig2",
        "gpu": "lab/results/gpu/results.jsonl",
        # issue 64's claims: every arm, the partners too, on seeds run after their registration (runs/untested,
        # kept here; the GPU pair's partners again in the GPU study after the registration)
        "untested": "lab/results/untested", "untested-gpu": "lab/results/untested-gpu/results.jsonl",
        # issue 77's replication: fresh seeds 3, 4, 5 of the headline claims' arms, run after their registration
        "replication": "lab/results/replication"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kept_runs(study, root=ROOT):
    """[(arm, seed, commit, date)] of the kept runs of `study` (KEPT): done.json's commit and commit_date
    (UTC "YYYY-MM-DD HH:MM"), or a GPU result line's commit and date (a day)."""
    path = os.path.join(root, KEPT[study])
    if path.endswith(".jsonl"):
        lines = [json.loads(ln) for ln in open(path) if ln.strip()] if os.path.isfile(path) else []
        return [(r["arm"], r["seed"], r.get("commit", "?"), r.get("date", "?")) for r in lines]
    import kept  # (lab/kept.py: a study's runs.jsonl; none there: no runs)
    runs = []
    for line in kept.read(path):
        if "done.json" in line["files"] and "arm" in line:
            d = json.loads(line["files"]["done.json"])
            runs.append((line["arm"], line["seed"], d.get("commit", "?"), d.get("commit_date", "?")))
    return sorted(runs)


def older(commit, date, registered, git=ROOT):
    """Whether a run of code `commit` (committed at `date`, UTC "YYYY-MM-DD[ HH:MM]") is older than a claim
    `registered` ("YYYY-MM-DD HH:MM commit"). With git history (`git`: a repository folder; None: none) and
    both commits in it: the run's commit is a strict ancestor of the registration's. Else by date: the run's
    date before the registration's (to the day when the run records only a day)."""
    when, reg = registered[:16], registered[17:].split()[0] if len(registered) > 17 else ""
    run = commit.split("+")[0]
    if git and reg and run not in ("", "?", "unknown") and os.path.exists(os.path.join(git, ".git")):
        git_ = lambda *a: subprocess.run(["git", *a], cwd=git, capture_output=True, text=True)  # noqa: E731
        try:
            full = [git_("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}") for c in (run, reg)]
            if all(f.returncode == 0 for f in full):
                return full[0].stdout != full[1].stdout and git_("merge-base", "--is-ancestor", run, reg).returncode == 0
        except OSError:  # no git program: by date
            pass
    if date in ("", "?", "unknown"):
        return True  # a run that says nothing of its date cannot show it came after
    return date < when[:len(date)]


def engaged(gate, record):
    """Whether a mechanism is at work: every (key, op, threshold) of `gate` (a claim's .gate) holds on
    `record` (arm a's last epoch of log.jsonl, averaged over seeds by the caller). True for an empty gate;
    None when a gated key is missing from the record (not measured)."""
    ops = {">=": lambda x, t: x >= t, "<=": lambda x, t: x <= t}
    if not gate:
        return True
    if any(k not in record or record[k] is None for k, _, _ in gate):
        return None
    return all(ops[op](record[k], t) for k, op, t in gate)


def mean_record(records):
    """The mean over seeds of each signal (signals()) every record has: the record engaged() reads."""
    records = [signals(r) for r in records if r]
    keys = set.intersection(*(set(r) for r in records)) if records else set()
    return {k: statistics.mean(r[k] for r in records) for k in keys
            if all(isinstance(r[k], (int, float)) and r[k] is not None for r in records)}


SIGNAL = {"bal_loss": "eq. 6", "div_loss": "eq. 9", "stage0_loss": "stage-0 loss", "mix_dev": "mixture deviation",
          "loop_update_min": "smallest loop update", "signature": "signature"}


def reading(claim, record):
    """The mechanism's reading, printed beside a verdict and never instead of it (issue 77): "" for a claim
    without a gate; "mechanism at work"; "mechanism not at work: eq. 6 0.01 < 0.1" (each failed threshold of
    the gate on `record`, mean_record of the gated arm's last epochs); "signature not measured" where the
    record lacks a gated key. Where the gate was fixed after a run that judges the claim (gate_after_runs),
    ", gate fixed after the runs" is added."""
    if not claim.gate:
        return ""
    record = record or {}
    on = engaged(claim.gate, record)
    if on is None:
        said = "signature not measured"
    elif on:
        said = "mechanism at work"
    else:
        fails = [f"{SIGNAL.get(k, k)} {record[k]:.2f} {'<' if op == '>=' else '>'} {t:g}" for k, op, t in claim.gate
                 if not engaged(((k, op, t),), record)]
        said = "mechanism not at work: " + ", ".join(fails)
    return said + (", gate fixed after the runs" if gate_after_runs(claim) else "")


def judge(claim, a, b, cpus=None, record=None, widen=0.0):
    """(mean difference, half-width, verdict in words) of `claim` on the per-seed scores a, b paired by seed:
    the rule's verdict() always, with the mechanism's reading (reading(): its gate on `record`, mean_record of
    the gated arm's last epochs) beside it in parentheses, and "(n of N seeds)" where fewer seeds than
    registered were paired; (None, None, "not run") without a pair. A gate never replaces the verdict
    (issue 77): "disagree (mechanism not at work: eq. 6 0.01 < 0.1, gate fixed after the runs)"."""
    if not a:
        return None, None, "not run"
    mean, half = interval(a, b, cpus, widen)
    v = verdict(claim.kind, claim.margin, a, b, cpus, widen)
    said = reading(claim, record)
    if said:
        v += f" ({said})"
    if len(a) < claim.seeds:
        v += f" ({len(a)} of {claim.seeds} seeds)"
    return mean, half, v


def claims_of(*studies):
    """The claims of `studies`, in registry order."""
    return [c for c in CLAIMS if c.study in studies]


CLAIMS: list[Claim] = []



def signals(record):
    """The mechanism signatures' measured values of one run's last epoch (log.jsonl): its own keys, and
    mix_dev = max_r |w_r - 1/R| of SR-ViT's mean mixture weights (mix_weights)."""
    out = dict(record)
    w = record.get("mix_weights")
    if w:
        out["mix_dev"] = max(abs(x - 1 / len(w)) for x in w)
    return out


# --- The claims registered before this registry existed, each with the date and commit its words and arms were first
# written (`git log -S`, UTC). A margin chosen for this registry (2026-12-04) is newer than the runs it judges: those
# claims are exploratory on the kept runs and confirmatory on the seeds run after it.
NOW = "2026-12-04 18:07 0c232fb"  # (the commit that registered them)
CROSSROADS = "Training Crossroads"
ONE_POINT = ("the paper gives no number (only its abstract was available); 1 point is the smallest difference three "
             "paired seeds of this protocol resolve (the 2-seed spreads of lab/results/mini: 0.1-1.3 points)")
REVIT_E4 = (("bal_loss", ">=", 0.1), ("div_loss", "<=", 0.7))
REVIT_E4_WORDS = ("the experts are at work: at the end, eq. 6 term (1 - H(g_t)/log E, mean over steps) >= 0.1 (gates away "
                  "from uniform) and eq. 9 term (mean squared cosine between experts) <= 0.7 (distinct experts)")
SRVIT = (("mix_dev", ">=", 0.05),)
SRVIT_WORDS = ("the recursions are mixed unevenly: the mean mixture weight of some recursion at least 0.05 from 1/R "
               "(log.jsonl mix_weights; the per-token spread is not logged)")
DS = (("stage0_loss", "<=", 3.6),)
DS_WORDS = "the first stage's readout classifies: its training loss at the end <= 3.6 (ln 100 = 4.6 is chance)"
# LoopVAE's claim 6: latency and MAC ratios within 10 % of each other (relative) cannot be told apart: one timing per
# arm, taken in turns. Our choice (first written at 865950a), not derived from repeated timings.
LOOPVAE_RATIO_MARGIN = 0.10
CLAIMS += [
    # Training Crossroads (abstract) and SoftMoR, the CPU study (lab/summarize_mini.py's CLAIMS until 2026-12-04)
    Claim("matched-flops", CROSSROADS, "abstract", "matched FLOPs: the untied ViT beats bViT", "mini", "vit", "bvit", 1,
          ">", None, "", 3, None, "2026-11-30 09:44 e9b7d1a"),
    Claim("matched-params", CROSSROADS, "abstract", "matched parameters: the wider bViT beats the narrow untied ViT",
          "mini", "bvit-wide", "vit-narrow", 1, ">", None, "", 3, None, "2026-11-30 09:44 e9b7d1a"),
    Claim("ds-beyond-horizon", CROSSROADS, "abstract", "deep supervision degrades gracefully beyond the horizon where "
          "naive recurrence collapses (4x depth)", "mini", "bvit-ds", "bvit", 4, ">", None, "", 3, DS_WORDS,
          "2026-11-30 09:44 e9b7d1a", gate=DS),
    Claim("ds-nominal", CROSSROADS, "abstract", "deep supervision does not improve nominal accuracy (trained depth)",
          "mini", "bvit-ds", "bvit", 1, "<=", 1.0, ONE_POINT, 3, DS_WORDS, NOW, exploratory=True, gate=DS),
    Claim("rk4-vs-euler", CROSSROADS, "abstract", "solver order at equal NFE: RK4 is no uniform gain over Euler", "mini",
          "odevit-rk4", "odevit-euler", 1, "<=", 1.0, ONE_POINT, 3, None, NOW, exploratory=True),
    Claim("heun-vs-euler", CROSSROADS, "abstract", "solver order at equal NFE: Heun is no uniform gain over Euler",
          "mini", "odevit-heun", "odevit-euler", 1, "<=", 1.0, ONE_POINT, 3, None, NOW, exploratory=True),
    Claim("srvit-r2", "SoftMoR", "abstract", "R=2 recursions beat R=1", "mini", "srvit-r2", "srvit-r1", 1, ">", None,
          "", 3, SRVIT_WORDS, "2026-11-30 09:44 e9b7d1a", gate=SRVIT),
    # The structured-init claims (issue 50): 8x8 patches, every arm on PyTorch's default base init
    Claim("init-structured-vs-pytorch", "structured init", "small datasets (a reproduction with its code: CIFAR-100 "
          "73.40 vs 67.95)", "structured init beats PyTorch's default init", "init", "init-structured",
          "init-pytorch", 1, ">", None, "", 3, None, "2026-12-03 07:20 02dfb3d"),
    Claim("init-structured-vs-mimetic", "structured init", "its earlier version: 70.46 vs 70.40", "structured init is "
          "not worse than mimetic init", "init", "init-mimetic", "init-structured", 1, "<=", 0.5,
          "the paper's own pair differs by 0.06 points, which it calls a match; 0.5 points, half of ONE_POINT's "
          "resolution, is the most a match can lose here", 3, None, NOW, exploratory=True),
    # reViT, supervised at its paper's protocol (Tables 3, 5, 10; lab/results/revit): E=4's experts must be at work
    Claim("revit-e4-vs-e1", "reViT", "Table 5 (S/16: 78.2 vs 70.6)", "E=4 depth-programmed experts beat E=1, both at "
          "fixed depth", "revit", "revit-e4", "revit-e1", 1, ">", None, "", 3, REVIT_E4_WORDS,
          "2026-11-30 09:44 e9b7d1a", gate=REVIT_E4),
    *[Claim(f"revit-e4-vs-{arm}", "reViT", f"Table 3, U = 1 (78.2 vs {top1})", f"at U = 1, reViT E=4 beats {name}",
            "revit", "revit-e4", f"revit-{arm}", 1, ">", None, "", 3, REVIT_E4_WORDS, "2026-12-03 06:40 eb32335",
            gate=REVIT_E4)
      for arm, name, top1 in (("deepseek", "DeepSeek-V3", "70.6"), ("qwen3", "Qwen3", "68.6"), ("moeut", "MoEUT", "67.8"),
                              ("remoe", "ReMoE", "70.1"), ("softmoe", "Soft-MoE", "69.2"))],
    *[Claim(f"revit-{arm}-near-e4", "reViT", f"Table 3, U = 1 (78.2 vs {top1})", f"{name} lands near reViT E=4",
            "revit", "revit-e4", f"revit-{arm}", 1, "~", 0.5, "Table 3 calls 77.9 and 77.7 against 78.2 close: 0.5 "
            "points, the larger gap", 3, REVIT_E4_WORDS, NOW, exploratory=True, gate=REVIT_E4)
      for arm, name, top1 in (("lory", "Lory", "77.9"), ("smear", "SMEAR", "77.7"))],
    Claim("revit-e4-vs-lora", "reViT", "Table 10 (78.2 vs 77.6)", "reViT E=4 at least matches layer-wise LoRA",
          "revit", "revit-lora", "revit-e4", 1, "<=", 0.5, "Table 10's E=4 leads by 0.6; 'at least matches': LoRA does "
          "not lead by more than the 0.5 points Table 3 calls close", 3, REVIT_E4_WORDS, NOW, exploratory=True,
          gate=REVIT_E4, gated="revit-e4"),
    Claim("revit-distill-control", "ours", "our control (sec. 3.2's objective with the task loss)", "final-feature "
          "distillation from a trained teacher beats supervised training alone", "revit", "revit-e4+feature",
          "revit-e4", 1, ">", None, "", 3, None, "2026-11-30 15:24 cbfa50c"),
    # Our fixed-depth-continuation comparison of elastic depth (ours, not the paper's Fig. 2: fig2-* below)
    Claim("elastic-keeps-1x", "ours", "our comparison (the paper's Fig. 2 is fig2-*)", "elastic depth keeps the "
          "fixed-depth top-1 at the trained depth", "revit", "revit-e4-elastic", "revit-e4-cont", 1, "~", 1.0,
          ONE_POINT, 3, None, NOW, exploratory=True),
    *[Claim(f"elastic-beats-{k}x", "ours", "our comparison (the paper's Fig. 2 is fig2-*)", f"elastic depth degrades "
            f"less than fixed depth at {k} x the trained depth", "revit", "revit-e4-elastic", "revit-e4-cont", k, ">",
            None, "", 3, None, "2026-12-03 06:40 eb32335") for k in (0.5, 2)],
    # (the elastic-depth claims carry no gate: depth dropout, their mechanism, needs no specialized experts; they
    # were gated on REVIT_E4 from 6245914 to issue 77)
    # The GPU study's own init claim (its recipe trains with timm's init)
    Claim("gpu-init-structured-vs-timm", "structured init", "abstract", "structured attention init beats the default "
          "(timm) init", "gpu", "vit+structured", "vit", 1, ">", None, "", 3, None, "2026-11-30 10:47 fdcc93e"),
    # reViT's second regime (lab/results/revit-teacher): the students do specialize (eq. 6 term 0.40-0.43 at the end)
    Claim("teacher-keeps-95", "reViT", "sec. 1, 4.2 (E=8 'retains nearly all' of its teacher's linear probe)",
          "the distilled E=4 student keeps >= 95 % of its teacher's linear-probe top-1", "teacher",
          "revit-e4+feature-only", "0.95 x vit", 1, ">", None, "", 3, REVIT_E4_WORDS, "2026-12-01 22:13 931e04c",
          metric="linear probe top-1", gate=REVIT_E4),
    Claim("teacher-rho", "reViT", "App. D (rho 0.969 at E=1 -> 0.999 at E=8)", "E=4 aligns closer to proportional "
          "teacher depth than E=1: a higher rho", "teacher", "revit-e4+feature-only", "revit-e1+feature-only", 1, ">",
          None, "", 3, REVIT_E4_WORDS, "2026-12-01 22:13 931e04c", metric="rho", gate=REVIT_E4),
    Claim("teacher-mad", "reViT", "App. D (MAD 1.54 at E=1 -> 0.23 at E=8)", "E=4 aligns closer to proportional "
          "teacher depth than E=1: a lower MAD", "teacher", "revit-e1+feature-only", "revit-e4+feature-only", 1, ">",
          None, "", 3, REVIT_E4_WORDS, "2026-12-01 22:13 931e04c", metric="MAD (layers)", gate=REVIT_E4,
          gated="revit-e4+feature-only"),
    Claim("teacher-deletions", "reViT", "App. D", "most expert deletions cost less teacher CKA than matched random "
          "gate changes", "teacher", "revit-e4+feature-only", "1/2", 1, ">", None, "", 3, REVIT_E4_WORDS,
          "2026-12-01 22:13 931e04c", metric="fraction of deletions costing less", gate=REVIT_E4),
    Claim("teacher-permutations", "reViT", "App. D (E=4 0.793 -> 0.208 on average)", "every non-identity permutation "
          "of E=4's gate columns reduces teacher CKA", "teacher", "revit-e4+feature-only", "its best permutation", 1,
          ">", None, "", 3, REVIT_E4_WORDS, "2026-12-01 22:13 931e04c", metric="teacher CKA", gate=REVIT_E4),
    # Anytime inference (ours: no paper states them; lab/results/mini)
    Claim("anytime-ds-60", "ours", "issue 40", "with deep supervision (bvit-ds), per-image exit keeps full-depth top-1 "
          "at no more than 60 % of the block applications", "anytime", "60 %", "bvit-ds", 1, ">", None, "", 3,
          DS_WORDS, "2026-12-01 22:28 b5662e4", metric="% of the trained depth's blocks", gate=DS, gated="bvit-ds"),
    *[Claim(f"anytime-exit-{arm}", "ours", "issue 40", "the best exit rule beats fixed-depth truncation at equal "
            "compute (held out)", "anytime", arm, "fixed-depth truncation", 1, ">", None, "", 3, None,
            "2026-12-01 22:28 b5662e4", metric="held-out top-1 gain") for arm in
      ("bvit", "bvit-ds", "revit-e4-elastic", "srvit-r2", "odevit-euler")],
    # LoopVAE (arXiv 2609.11516; lab/results/loopvae): written after the first study's runs they judge (4a9b6d4, 3801a10).
    # Claim 6 compares two ratios of one timing per arm, so no seeds pair: its verdict needs the latency ratio beyond
    # the MAC ratio by more than LOOPVAE_RATIO_MARGIN, relative (summarize_loopvae.cost_row).
    *[Claim(f"loopvae-sharing-{pre}{other}", "LoopVAE", "Table 2 (Transformer core, ImageNet-256: 31.16 vs "
            f"{'30.41' if other == 'scale' else '31.04'} dB)", f"sharing: global beats {other}", "loopvae",
            f"loopvae-{pre}global", f"loopvae-{pre}{other}", 1, ">", None, "", 3, "each pass updates the features: "
            "the loop interventions' relative update > 1 % (loops.json)", "2026-12-01 12:31 4a9b6d4",
            exploratory=True, metric="PSNR (dB)", gate=(("loop_update_min", ">=", 0.01),),
            misregistered=None if other == "scale" else "the paper calls global vs unshared (31.16 vs 31.04 dB) "
            "'competitive', a '~' claim (loopvae-sharing-vit-competitive), not '>'")
      for pre, other in (("", "scale"), ("", "none"), ("vit-", "none"))],
    *[Claim(f"loopvae-{n}", "LoopVAE", where, words, "loopvae", "loopvae-global", "loopvae-scale", 1, ">", None, "",
            3, "each pass updates the features: relative update > 1 % (loops.json)", "2026-12-01 12:31 4a9b6d4",
            exploratory=True, metric="PSNR per image and stage (summarize_loopvae.py)")
      for n, where, words in (("2", "sec. 4.4", "completing the schedule: PSNR rises with every pass kept"),
                              ("3", "sec. 4.4", "every bypassed pass loses PSNR; the most sensitive is not the last"),
                              ("4", "sec. 4.4", "the pass that changes the features least costs more than a larger-update "
                                            "pass"),
                              ("5", "sec. 4.4", "truncation is not early exit"),
                              ("6", "sec. 4.7", "looping costs more per MAC: the latency ratio exceeds the MAC ratio"))],
    Claim("loopvae-6b", "LoopVAE", "sec. 4.7 (its cost table compares models at their own quality)", "at matched "
          "quality, the unlooped hierarchy reaches the global arm's PSNR in less time", "loopvae", "loopvae-global",
          "loopvae-unlooped", 1, "<=", 0.3, "0.3 dB, the smallest PSNR difference the paper's Table 2 reads as a "
          "difference (31.16 vs 30.41: 0.75; 31.16 vs 31.04: 0.12 it calls comparable)", 3, None,
          "2026-12-02 01:32 3801a10", exploratory=True, metric="PSNR (dB)"),
]

# The reViT paper's Fig. 2 (sec. 4.4; A.2-A.3), in our second regime (lab/arms.py fig2_arms, L = 6): the depth-only gate
# (revit-e4-fig2-elastic) and the feature-only gate (revit-smear-fig2-elastic), both students of the same seed's vit
# by its final features alone, then elastic depth; scored by frozen probes (probe.py --depth) at relative depths
# 2/3, 1, 4/3 and 2 of L (the paper's 8, 12, 16, 24 for L = 12). The linear probe (CIFAR-100, top-1 in points) is the
# analogue of its ImageNet probe, our mosaic segmentation (mIoU in points) of its ADE20k one.
REVIT_E4_ENGAGED, REVIT_E4_SIGNATURE = REVIT_E4, REVIT_E4_WORDS
FIG2 = "2026-12-04 18:02 6245914"  # (the commit whose message says FIG2-READY: the runs start from it)
NEAR = ("the paper calls a 0.2 mIoU drop (44.9 at L=16 -> 44.7 at L=24) 'near its best' beside a 4.6-point gain from L=8 "
        "to 16; 1 point is about a tenth of our linear probe's gain between depths and the smallest step its seed spread "
        "(0.55-1.07 points over 2 seeds, lab/results/revit-teacher) lets 3 seeds resolve")
FLAT = ("the paper's 'nearly flat beyond L=12' spans differences it does not print (read off Fig. 2: under 1 mIoU / 1 point "
        "from 12 to 24); 1 point, as NEAR")
CLAIMS += [
    Claim("fig2-ahead-at-L", "reViT", "sec. 4.4, Fig. 2", "At L=12, the feature-only control reaches approximately 35.6 "
          "ADE20k mIoU. Our depth-only variant reaches 44.4 mIoU, 83.4% ImageNet linear-probe top-1", "fig2",
          "revit-e4-fig2-elastic", "revit-smear-fig2-elastic", 1, ">", None, "", 3, REVIT_E4_SIGNATURE, FIG2,
          metric="linear probe top-1", gate=REVIT_E4_ENGAGED),
    Claim("fig2-ahead-at-L-seg", "reViT", "sec. 4.4, Fig. 2", "At L=12, the feature-only control reaches approximately "
          "35.6 ADE20k mIoU. Our depth-only variant reaches 44.4 mIoU", "fig2", "revit-e4-fig2-elastic",
          "revit-smear-fig2-elastic", 1, ">", None, "", 3, REVIT_E4_SIGNATURE, FIG2, metric="mosaic mIoU",
          gate=REVIT_E4_ENGAGED),
    Claim("fig2-improves-to-L", "reViT", "sec. 4.4, Fig. 2", "Our proposed variant improves on all three probes through "
          "L=16 [...] ImageNet top-1 increases from 82.6% to 83.7%", "fig2", "revit-e4-fig2-elastic",
          "revit-e4-fig2-elastic", 1, ">", None, "", 3, REVIT_E4_SIGNATURE, FIG2, metric="linear probe top-1",
          depth_b=2 / 3, gate=REVIT_E4_ENGAGED),
    Claim("fig2-improves-to-4/3L", "reViT", "sec. 4.4, Fig. 2", "Our proposed variant improves on all three probes "
          "through L=16 [...] ADE20k rises from 40.3 mIoU at L=8 to 44.9 at L=16", "fig2", "revit-e4-fig2-elastic",
          "revit-e4-fig2-elastic", 4 / 3, ">", None, "", 3, REVIT_E4_SIGNATURE, FIG2, metric="linear probe top-1",
          depth_b=1, gate=REVIT_E4_ENGAGED),
    Claim("fig2-near-best-at-2L", "reViT", "sec. 4.4, Fig. 2", "[it] remains near its best at L=24. ADE20k [...] 44.9 at "
          "L=16 and remains at 44.7 at L=24", "fig2", "revit-e4-fig2-elastic", "revit-e4-fig2-elastic", 4 / 3, "<=",
          1.0, NEAR, 3, REVIT_E4_SIGNATURE, FIG2, metric="linear probe top-1", depth_b=2, gate=REVIT_E4_ENGAGED),
    Claim("fig2-feature-only-flat", "reViT", "sec. 4.4, Fig. 2", "Beyond L=12, the feature-only control is nearly flat "
          "on ImageNet and ADE20k", "fig2", "revit-smear-fig2-elastic", "revit-smear-fig2-elastic", 2, "~", 1.0, FLAT,
          3, None, FIG2, metric="linear probe top-1", depth_b=1),
]


# ----------------------------------------------------------------------------- issue 64
# Judged only on runs made after the registration, the partner arms' runs too (studies "untested" and
# "untested-gpu": OUT=runs/untested ARMS=untested SEEDS="0 1 2" bash lab/reproduce_mini.sh), so that no run
# known before the claim was written judges it.
# The papers' claims rvits never tested before (issue 64), registered 2026-12-04 at 257165c (the commit that holds
# them; written on 6162896), before any of their runs. Four compare differences of arms: an arm may be a contrast
# "X - Y", per seed X's top-1 minus Y's, both runs of that seed (paired() reads it; "vit-d48 - bvit-d48" is the
# ViT-minus-bViT gap at D=48). "Not uniform" needs a kind the three above lack:
#     "!~"  a and b differ by more than `margin`, either way: the mirror of "~" (agree where "~" disagrees, the
#           interval on a - b wholly outside +-margin; disagree where "~" agrees, the interval inside +-margin).
# judge_scores(claim, scores) gives any claim's verdict through the one rule, verdict(), with both.
CONTRAST = " - "  # "X - Y": the per-seed difference of two arms
NOT_WITHIN = "!~"
KINDS += (NOT_WITHIN,)


def paired(arm, scores):
    """The per-seed scores of `arm` (a list): scores[arm] for an arm's name; for a contrast "X - Y" (CONTRAST),
    scores[X][i] - scores[Y][i] for each seed i. scores: arm name -> per-seed top-1 (points), every list in the
    same seed order. Raises KeyError naming an arm without scores, ValueError for lists of different lengths."""
    if CONTRAST not in arm:
        return list(scores[arm])
    x, y = (scores[a] for a in arm.split(CONTRAST))
    if len(x) != len(y):
        raise ValueError(f"{arm}: {len(x)} and {len(y)} seeds; a contrast pairs the two arms' runs seed by seed")
    return [u - v for u, v in zip(x, y)]


def judge_scores(claim, scores):
    """The verdict ("agree", "disagree" or "cannot tell") of `claim` on `scores` (arm name -> per-seed top-1):
    verdict(kind, margin, a, b) on the per-seed scores of its arms (paired: names or contrasts); NOT_WITHIN
    ("!~") is the mirror of "~" under the same rule."""
    a, b = paired(claim.a, scores), paired(claim.b, scores)
    if claim.kind != NOT_WITHIN:
        return verdict(claim.kind, claim.margin, a, b)
    said = verdict("~", claim.margin, a, b)
    return {"agree": "disagree", "disagree": "agree"}.get(said, said)


ISSUE64 = "2026-12-04 17:53 257165c"
CLAIMS += [  # the papers' claims never tested before (issue 64)
    # 1. Training Crossroads' black-box field, beside the state-subtracted one at the same NFE (8, Euler).
    Claim(key="crossroads-blackbox-costs", paper="Training Crossroads", where="abstract",
          words="the continuous-time analogue of a residual recurrent block is the state-subtracted vector field "
                "z' = F(z) - z; although known in principle, this distinction is easy to violate when the block is "
                "wrapped as a black-box vector field, and we qualify the cost at few accuracy points",
          study="untested", a="odevit-euler", b="odevit-blackbox", depth=1, kind=">", margin=None,
          why_margin="'a cost' is a loss of accuracy: the state-subtracted field beats the black-box one (the lower "
                     "end of 'few points'; its upper end is crossroads-blackbox-costs-few)",
          seeds=3, signature="the black-box field is at work: in analyze.py's steps.json the black-box arm's token "
                             "norm (act_norm) grows from step 1 to step 8 at least 2x as much as the state-subtracted "
                             "arm's (its Euler step z + F(z) adds the state again at every step)",
          registered=ISSUE64),
    Claim(key="crossroads-blackbox-costs-few", paper="Training Crossroads", where="abstract",
          words="we qualify the cost at few accuracy points",
          study="untested", a="odevit-euler", b="odevit-blackbox", depth=1, kind="<=", margin=5.0,
          why_margin="'few accuracy points' allows a cost of more than 0 and at most 5 points (our reading of 'few': "
                     "the abstract gives no number); the lower end is crossroads-blackbox-costs",
          seeds=3, signature="as crossroads-blackbox-costs", registered=ISSUE64),
    # 2. Solver order: the gain over Euler at equal NFE in two settings, NFE 8 (T = 8) and NFE 4 (T = 4).
    Claim(key="crossroads-rk4-gain-not-uniform", paper="Training Crossroads", where="abstract",
          words="higher-order solvers act as a solver-induced architectural bias rather than a numerical-accuracy "
                "improvement, and their gains are not uniform",
          study="untested", a="odevit-rk4 - odevit-euler", b="odevit-rk4-nfe4 - odevit-euler-nfe4", depth=1,
          kind=NOT_WITHIN, margin=1.0,
          why_margin="1 point, the resolution of the study's other solver claims (the abstract gives none): twice "
                     "the binomial standard error of one top-1 on CIFAR-100's 10,000 test images (~0.5 at 50 %)",
          seeds=3, signature=None, registered=ISSUE64),
    Claim(key="crossroads-heun-gain-not-uniform", paper="Training Crossroads", where="abstract",
          words="higher-order solvers act as a solver-induced architectural bias rather than a numerical-accuracy "
                "improvement, and their gains are not uniform",
          study="untested", a="odevit-heun - odevit-euler", b="odevit-heun-nfe4 - odevit-euler-nfe4", depth=1,
          kind=NOT_WITHIN, margin=1.0, why_margin="as crossroads-rk4-gain-not-uniform",
          seeds=3, signature=None, registered=ISSUE64),
    # 3. bViT's width trend: the ViT-minus-bViT gap (matched FLOPs) shrinks from the narrower to the wider pair.
    Claim(key="bvit-width-trend-mini", paper="bViT", where="abstract",
          words="recurrent performance improves with representation width, with wider bViTs recovering much more "
                "of the performance of standard ViTs than narrow variants",
          study="untested", a="vit-d48 - bvit-d48", b="vit - bvit", depth=1, kind=">", margin=None,
          why_margin="'much more' has no number: the gap at D=48 above the gap at D=96 (a direction, no margin)",
          seeds=3, signature="the shared block acts differently across steps (the paper's 'implicit depth "
                             "multiplexing'): in analyze.py's cka.json of each bViT arm, the self-CKA of step 1 and "
                             "step 8 below 0.9",
          registered=ISSUE64),
    Claim(key="bvit-width-trend-gpu", paper="bViT", where="abstract",
          words="recurrent performance improves with representation width, with wider bViTs recovering much more "
                "of the performance of standard ViTs than narrow variants",
          study="untested-gpu", a="vit-d96 - bvit-d96", b="vit - bvit", depth=1, kind=">", margin=None,
          why_margin="as bvit-width-trend-mini: the gap at D=96 above the gap at D=192",
          seeds=3, signature="as bvit-width-trend-mini, of steps 1 and 12",
          registered=ISSUE64),
]


# ----------------------------------------------------------------------------- issue 77: the replication
# One replication fixed in advance: four headline claims a user reads first, each written again here with its rule
# (verdict(): the 90 % t-interval on the paired differences, widened by HARDWARE_NOISE for pairs on two CPU models),
# its kind, its margin, its gate and the seeds that judge it, all before any of their runs. The seeds 3, 4 and 5 were
# never run for any arm of any study (lab/results/: seeds 0-2 only), so each run is new data, not a bit-exact rerun of a
# run known before. Judged only on study "replication" (lab/results/replication, runs of those seeds made at or after the
# registering commit: OUT=runs/replication SEEDS="3 4 5" ARMS="..." bash lab/reproduce_mini.sh), printed as the
# confirmatory replication beside the earlier verdicts, which it does not replace. A gate never replaces the rule's
# verdict: the mechanism's reading is printed beside it.
REPLICATION = "2026-12-07 07:09 c331672"  # (the commit that holds this block; its runs start from the next)
FRESH = (3, 4, 5)
CLAIMS += [
    Claim(key="replication-matched-flops", paper=CROSSROADS, where="abstract",
          words="standard ViTs remain preferable when FLOPs are the primary constraint", study="replication",
          a="vit", b="bvit", depth=1, kind=">", margin=None,
          why_margin="a direction: the untied ViT above the bViT of the same FLOPs (8 block applications)",
          seeds=3, signature=None, registered=REPLICATION, fresh_seeds=FRESH),
    Claim(key="replication-matched-params", paper=CROSSROADS, where="abstract",
          words="recurrent ViTs offer a better accuracy--parameter trade-off under memory constraints",
          study="replication", a="bvit-wide", b="vit-narrow", depth=1, kind=">", margin=None,
          why_margin="a direction: the wider bViT above the narrow untied ViT of the same parameter memory",
          seeds=3, signature=None, registered=REPLICATION, fresh_seeds=FRESH),
    Claim(key="replication-ds-beyond-horizon", paper=CROSSROADS, where="abstract",
          words="stage-wise deep supervision [...] degrades gracefully far beyond the training horizon, where naive "
                "recurrence collapses to near-random performance",
          study="replication", a="bvit-ds", b="bvit", depth=4, kind=">", margin=None,
          why_margin="a direction: at 4x the trained depth (32 steps), the deep-supervised bViT above the naive one",
          seeds=3, signature=DS_WORDS, registered=REPLICATION, gate=DS, fresh_seeds=FRESH),
    Claim(key="replication-width-trend", paper="bViT", where="abstract",
          words="recurrent performance improves with representation width, with wider bViTs recovering much more of "
                "the performance of standard ViTs than narrow variants",
          study="replication", a="vit-d48 - bvit-d48", b="vit - bvit", depth=1, kind=">", margin=None,
          why_margin="'much more' has no number: the ViT-minus-bViT gap at D=48 above the gap at D=96 (a direction)",
          seeds=3, signature="the shared block acts differently across steps: in analyze.py's cka.json of each bViT "
                             "arm (bvit, bvit-d48), the self-CKA of step 1 and step 8 below 0.9, mean over seeds",
          registered=REPLICATION, fresh_seeds=FRESH),
]


# ----------------------------------------------------------------------------- issue 77: timelines
# What was fixed when, from git (lab/tests/test_claims.py checks each against `git log -S`): a claim is confirmatory only
# when its words, arms, kind, margin, seeds, rule and gate were all fixed before the first run that judges it (a rerun
# that reproduces an earlier run bit for bit counts as that run); else it is exploratory, printed apart.
RULE_FIXED = "2026-12-04 18:02 6245914"  # verdict()'s 90 % t-interval (T90): the earlier rule compared means with spreads
SEEDS_FIXED = "2026-12-04 17:27 6162896"  # the Claim record's `seeds` (3 paired seeds)
GATES_FIXED = {REVIT_E4: "2026-12-04 18:02 6245914", DS: "2026-12-04 18:07 0c232fb", SRVIT: "2026-12-04 18:07 0c232fb",
               (("loop_update_min", ">=", 0.01),): "2026-12-06 04:34 dc5417f"}
SEEDS_AMENDED = {}  # claim key -> when its seeds were changed after its registration (before any of its runs)


def _later(*stamps):
    """The latest of "YYYY-MM-DD HH:MM commit" stamps (None ignored), by date."""
    return max((t for t in stamps if t), key=lambda t: t[:16])


def timeline(claim):
    """{"words, arms, kind", "margin", "seeds", "rule", "gate": "YYYY-MM-DD HH:MM commit"} of `claim`: when each part
    was fixed (the later of its registration and the part's own first commit); "margin" only for kinds with one,
    "gate" only for a gated claim."""
    out = {"words, arms, kind": claim.registered}
    if claim.margin is not None:
        out["margin"] = claim.registered
    out["seeds"] = _later(claim.registered, SEEDS_FIXED, SEEDS_AMENDED.get(claim.key))
    out["rule"] = _later(claim.registered, RULE_FIXED)
    if claim.gate:
        out["gate"] = _later(claim.registered, GATES_FIXED.get(tuple(claim.gate)))
    return out


def arms_of(claim):
    """Every arm whose runs judge `claim`: a and b (each arm of a contrast "X - Y") and the gated arm."""
    arms = {n for side in (claim.a, claim.b) for n in side.split(CONTRAST)}
    return arms | ({claim.gated} if claim.gated else set())


def _log_keys(study):
    """{(arm, seed): the training record of the kept run (its log.jsonl's epoch lines, timing keys left out) as a
    string} of `study`: two runs with the same record are one run made twice, bit for bit."""
    if study in _KEYS:
        return _KEYS[study]
    import kept  # (lab/kept.py)
    out = {}
    if not KEPT[study].endswith(".jsonl"):
        for line in kept.read(os.path.join(ROOT, KEPT[study])):
            log = line["files"].get("log.jsonl") if "arm" in line else None
            recs = [json.loads(x) for x in (log or "").splitlines() if x.strip()]
            recs = [{k: v for k, v in r.items() if not any(w in k for w in ("time", "img_per_s", "wall"))}
                    for r in recs if "epoch" in r]
            if recs:
                out[(line["arm"], line["seed"])] = json.dumps(recs, sort_keys=True)
    _KEYS[study] = out
    return out


_KEYS = {}
_FIRST = {}


def first_runs(claim):
    """[(arm, seed, commit, date)] of the kept runs that judge `claim`, each replaced by the earliest kept run of
    any study that it reproduces bit for bit (same arm and seed, the same training record): the runs whose
    dates say whether each part of the claim was fixed before them. Fresh-seed claims count their seeds only."""
    if claim.key in _FIRST:
        return _FIRST[claim.key]
    runs = [r for r in kept_runs(claim.study) if r[0] in arms_of(claim)
            and (not claim.fresh_seeds or r[1] in claim.fresh_seeds)]
    out = []
    for arm, seed, commit, date in runs:
        key = _log_keys(claim.study).get((arm, seed))
        twins = [(d, c) for study in KEPT if study != claim.study and not KEPT[study].endswith(".jsonl")
                 for a, s, c, d in kept_runs(study) if (a, s) == (arm, seed) and key
                 and _log_keys(study).get((a, s)) == key]
        d, c = min([(date, commit), *twins])
        out.append((arm, seed, c, d))
    _FIRST[claim.key] = out
    return out


def fixed_after(claim):
    """The parts of `claim` (timeline's names) fixed after a run that judges it (older()), in timeline order."""
    runs = first_runs(claim)
    return [part for part, stamp in timeline(claim).items()
            if any(older(commit, date, stamp, git=None) for _, _, commit, date in runs)]


def gate_after_runs(claim):
    """Whether `claim`'s gate was fixed after a run that judges it."""
    return "gate" in fixed_after(claim) if claim.gate and claim.key in {c.key for c in CLAIMS} else False


def exploratory(claim):
    """Whether `claim` is exploratory: registered so, or a part of it fixed after a run that judges it (fixed_after)."""
    return claim.exploratory or bool(fixed_after(claim))


def chance_agrees(claims):
    """The number of "agree" verdicts expected by chance among `claims` if no effect were real: the rule's two-sided
    90 % interval puts 5 % of a null ">" claim's intervals above 0 (and, for "<=" and "~" claims on a true
    difference at the margin's edge, at most 5 % inside it). Returns (expected, claims counted)."""
    return 0.05 * len(claims), len(claims)


# LoopVAE's Transformer-core sharing claim as the paper words it (issue 77): "competitive PSNR and SSIM under global
# sharing" against unshared blocks (Table 2: 31.16 vs 31.04 dB), a "~" claim; the ">" claim above misread it and stays,
# labelled. Registered before any run of its seeds: judged only on fresh seeds 3-5 of the Transformer-core arms.
LOOPVAE_COMPETITIVE = "2026-12-07 08:12 051216b"  # (the commit that holds this claim)
CLAIMS += [
    Claim(key="loopvae-sharing-vit-competitive", paper="LoopVAE", where="abstract; Table 2 (Transformer core, "
          "ImageNet-256: 31.16 vs 31.04 dB)", words="A non-adversarial Transformer ablation with the same execution "
          "graph finds competitive PSNR and SSIM under global sharing", study="loopvae", a="loopvae-vit-global",
          b="loopvae-vit-none", depth=1, kind="~", margin=0.3,
          why_margin="0.3 dB, the smallest PSNR difference the paper's Table 2 reads as a difference (31.16 vs 30.41: "
                     "0.75, a difference; 31.16 vs 31.04: 0.12, 'competitive'), as loopvae-6b",
          seeds=3, signature="each pass updates the features: the loop interventions' relative update > 1 % "
                             "(loops.json), measured on the global arm", registered=LOOPVAE_COMPETITIVE,
          metric="PSNR (dB)", gate=(("loop_update_min", ">=", 0.01),), fresh_seeds=(3, 4, 5)),
]


# ----------------------------------------------------------------------------- issue 80: the calibrated exit policy
# anytime.py's exit policy (Learn-then-Test, fixed-sequence over a threshold grid, binomial p-values) on the kept
# recurrent arms' checkpoints re-made bit for bit, 3 seeds each; per seed >= 50 random calibration / evaluation splits of
# CIFAR-100's 10,000 test images (5,000 / 5,000), delta = 0.1, rule confidence, loss disagreement with the budget's
# prediction (lab/anytime_study.py; study "anytime-policy"). Registered before any of the study's runs. odevit-euler is
# not an arm: its checkpoints are bvit's bit for bit (issue 77), one model counted once.
ANYTIME_POLICY = "2026-12-07 08:12 051216b"  # (the commit that holds these claims; no run of the study before it)
ANYTIME_ARMS = ("bvit", "bvit-ds", "revit-e4-elastic", "srvit-r2")
# Amended before any run of the study (its seeds only; words, arms, kind, margins and gate as above): judged on each
# arm's fresh seeds 3, 4 and 5, not seeds 0-2 re-made. Seeds 0-2 of these arms were analysed for early exit before
# (issue 40: bvit-ds within 0.5 points at 45 % of the blocks), which the 30 % of the savings claim was chosen knowing;
# no exit rule has read seeds 3-5. bvit and bvit-ds: the replication's checkpoints (lab/results/replication, trained
# at 2aafb45 for top-1 only); revit-e4 + revit-e4-elastic and srvit-r2: trained for this study (runs/anytime-policy).
# The study's own runs (lab/anytime_study.py) are what judge the claims; each records its commit and CPU model.
ANYTIME_SEEDS = (3, 4, 5)
ANYTIME_SEEDS_FIXED = "2026-12-07 10:05 528bceb"  # (the commit that holds this amendment; no run of the study before it)
KEPT["anytime-policy"] = "lab/results/anytime-policy"
CLAIMS += [
    *[Claim(f"anytime-policy-risk-{arm}", "ours", "issue 80, item 3", "the realized risk on the evaluation half exceeds "
            "eps in at most a fraction delta = 10 % of the splits, at each eps of 0.5, 1, 2 and 5 %", "anytime-policy",
            arm, "10 %", 1, "<=", 1.0, "per seed, the worst eps's violation rate over the splits (%); judged with "
            "widen = the 90 % Clopper-Pearson half-width of that rate (about 7 points at 10 % of 50 splits), the "
            "sampling error the seeds do not show; 1 point above delta is within the splits' resolution", 3, None,
            ANYTIME_POLICY, fresh_seeds=ANYTIME_SEEDS, metric="% of splits with realized risk > eps (worst of the four eps)") for arm in ANYTIME_ARMS],
    Claim("anytime-policy-saves-ds", "ours", "issue 80, item 3", "at eps = 1 %, deep-supervised bViT's certified "
          "policy saves at least 30 % of the block applications", "anytime-policy", "bvit-ds", "30 %", 1, ">", None,
          "", 3, DS_WORDS, ANYTIME_POLICY, metric="% of the budget's block applications saved (eps 1 %, mean over "
          "splits)", gate=DS, gated="bvit-ds", fresh_seeds=ANYTIME_SEEDS),
    Claim("anytime-policy-wall-256", "ours", "issue 80, item 3", "the exit path is faster in wall time than the "
          "fixed-depth forward at batch 256, not only in block applications", "anytime-policy", "bvit-ds", "1.0x",
          1, ">", None, "", 3, DS_WORDS, ANYTIME_POLICY, metric="exit-path img/s over fixed-depth img/s at batch 256 "
          "(eps 1 %, split 0's policy, lab/anytime_study.py --bench, one run)", gate=DS, gated="bvit-ds",
          fresh_seeds=ANYTIME_SEEDS),
]
SEEDS_AMENDED.update({c.key: ANYTIME_SEEDS_FIXED for c in CLAIMS if c.study == "anytime-policy"})
