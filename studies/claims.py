"""The one registry of the claims rvits tests (CLAIMS) and the one rule that judges them (verdict).

A claim is registered here before the runs that judge it: in its paper's words, with where the paper
says it, its two arms, its kind, its margin and why, its seeds, the measured signature that its
mechanism is at work, and the date and commit it was registered at. Every summarizer of studies/
reads its claims from here.

Kinds (a and b: the per-seed top-1, in points, of two arms paired by seed):
    ">"   a beats b.
    "<="  a does not beat b by more than `margin`.
    "~"   a and b lie within `margin` of each other.
Standard library only.
"""
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
    registered: "YYYY-MM-DD commit". exploratory: registered after runs it judges (stands apart).
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


CLAIMS: list[Claim] = []


# ----------------------------------------------------------------------------- issue 64
# The papers' claims rvits never tested before (issue 64), registered 2026-12-04 at 6162896, before any of their
# runs. Four compare differences of arms: an arm may be a contrast "X - Y", per seed X's top-1 minus Y's, both
# runs of that seed (paired() reads it; "vit-d48 - bvit-d48" is the ViT-minus-bViT gap at D=48). "Not uniform"
# needs a kind the three above lack:
#     "!~"  a and b differ by more than `margin`, either way: the mirror of "~" (agree where "~" disagrees, the
#           interval on a - b wholly outside +-margin; disagree where "~" agrees, the interval inside +-margin).
# judge(claim, scores) gives any claim's verdict through the one rule, verdict(), with both.
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


def judge(claim, scores):
    """The verdict ("agree", "disagree" or "cannot tell") of `claim` on `scores` (arm name -> per-seed top-1):
    verdict(kind, margin, a, b) on the per-seed scores of its arms (paired: names or contrasts); NOT_WITHIN
    ("!~") is the mirror of "~" under the same rule."""
    a, b = paired(claim.a, scores), paired(claim.b, scores)
    if claim.kind != NOT_WITHIN:
        return verdict(claim.kind, claim.margin, a, b)
    said = verdict("~", claim.margin, a, b)
    return {"agree": "disagree", "disagree": "agree"}.get(said, said)


ISSUE64 = "2026-12-04 6162896"
CLAIMS += [  # the papers' claims never tested before (issue 64)
    # 1. Training Crossroads' black-box field, beside the state-subtracted one at the same NFE (8, Euler).
    Claim(key="crossroads-blackbox-costs", paper="Training Crossroads", where="abstract",
          words="the continuous-time analogue of a residual recurrent block is the state-subtracted vector field "
                "z' = F(z) - z; although known in principle, this distinction is easy to violate when the block is "
                "wrapped as a black-box vector field, and we qualify the cost at few accuracy points",
          study="mini", a="odevit-euler", b="odevit-blackbox", depth=1, kind=">", margin=None,
          why_margin="'a cost' is a loss of accuracy: the state-subtracted field beats the black-box one (the lower "
                     "end of 'few points'; its upper end is crossroads-blackbox-costs-few)",
          seeds=3, signature="the black-box field is at work: in analyze.py's steps.json the black-box arm's token "
                             "norm (act_norm) grows from step 1 to step 8 at least 2x as much as the state-subtracted "
                             "arm's (its Euler step z + F(z) adds the state again at every step)",
          registered=ISSUE64),
    Claim(key="crossroads-blackbox-costs-few", paper="Training Crossroads", where="abstract",
          words="we qualify the cost at few accuracy points",
          study="mini", a="odevit-euler", b="odevit-blackbox", depth=1, kind="<=", margin=5.0,
          why_margin="'few accuracy points' allows a cost of more than 0 and at most 5 points (our reading of 'few': "
                     "the abstract gives no number); the lower end is crossroads-blackbox-costs",
          seeds=3, signature="as crossroads-blackbox-costs", registered=ISSUE64),
    # 2. Solver order: the gain over Euler at equal NFE in two settings, NFE 8 (T = 8) and NFE 4 (T = 4).
    Claim(key="crossroads-rk4-gain-not-uniform", paper="Training Crossroads", where="abstract",
          words="higher-order solvers act as a solver-induced architectural bias rather than a numerical-accuracy "
                "improvement, and their gains are not uniform",
          study="mini", a="odevit-rk4 - odevit-euler", b="odevit-rk4-nfe4 - odevit-euler-nfe4", depth=1,
          kind=NOT_WITHIN, margin=1.0,
          why_margin="1 point, the resolution of the study's other solver claims (the abstract gives none): twice "
                     "the binomial standard error of one top-1 on CIFAR-100's 10,000 test images (~0.5 at 50 %)",
          seeds=3, signature=None, registered=ISSUE64),
    Claim(key="crossroads-heun-gain-not-uniform", paper="Training Crossroads", where="abstract",
          words="higher-order solvers act as a solver-induced architectural bias rather than a numerical-accuracy "
                "improvement, and their gains are not uniform",
          study="mini", a="odevit-heun - odevit-euler", b="odevit-heun-nfe4 - odevit-euler-nfe4", depth=1,
          kind=NOT_WITHIN, margin=1.0, why_margin="as crossroads-rk4-gain-not-uniform",
          seeds=3, signature=None, registered=ISSUE64),
    # 3. bViT's width trend: the ViT-minus-bViT gap (matched FLOPs) shrinks from the narrower to the wider pair.
    Claim(key="bvit-width-trend-mini", paper="bViT", where="abstract",
          words="recurrent performance improves with representation width, with wider bViTs recovering much more "
                "of the performance of standard ViTs than narrow variants",
          study="mini", a="vit-d48 - bvit-d48", b="vit - bvit", depth=1, kind=">", margin=None,
          why_margin="'much more' has no number: the gap at D=48 above the gap at D=96 (a direction, no margin)",
          seeds=3, signature="the shared block acts differently across steps (the paper's 'implicit depth "
                             "multiplexing'): in analyze.py's cka.json of each bViT arm, the self-CKA of step 1 and "
                             "step 8 below 0.9",
          registered=ISSUE64),
    Claim(key="bvit-width-trend-gpu", paper="bViT", where="abstract",
          words="recurrent performance improves with representation width, with wider bViTs recovering much more "
                "of the performance of standard ViTs than narrow variants",
          study="gpu", a="vit-d96 - bvit-d96", b="vit - bvit", depth=1, kind=">", margin=None,
          why_margin="as bvit-width-trend-mini: the gap at D=96 above the gap at D=192",
          seeds=3, signature="as bvit-width-trend-mini, of steps 1 and 12",
          registered=ISSUE64),
]
