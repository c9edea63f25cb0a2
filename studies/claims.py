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
