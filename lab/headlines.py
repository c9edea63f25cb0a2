"""README's headline verdicts, rebuilt from the kept results by the summarizers alone (issue 63).

    python lab/headlines.py                     # print them
    python lab/headlines.py --readme README.md  # write them between README's <!-- headlines --> markers

Each line is one summarizer's verdicts on the registered claims (lab/claims.py) over the kept runs in lab/results/:
summarize_mini (lab/results/mini, lab/results/init, lab/results/revit; lab/results/revit-search, the engagement search),
summarize_teacher (lab/results/revit-teacher), summarize_fig2 (lab/results/revit-fig2), summarize_anytime (lab/results/mini),
summarize_untested (lab/results/untested with lab/results/mini) and summarize_loopvae (lab/results/loopvae); the GPU study's
line beside the block is written by hand. Nothing is measured: what a summarizer has not cached reads "not run".
"""
import argparse
import collections
import contextlib
import functools
import io
import os
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))
import claims as registry  # noqa: E402
import summarize_mini  # noqa: E402

LINK = {"mini": "[CPU study][cpu]", "revit": "[reViT][revit]", "teacher": "[second regime][regime]",
"anytime": "[anytime][anytime]", "loopvae": "[LoopVAE][loopvae]", "gpu": "[GPU study][gpu]",
"untested": "[untested claims][untested]", "replication": "[replication][replication]"}


def kept(*names):
    """The kept folders that exist, under ROOT/results."""
    return [p for p in (os.path.join(ROOT, "lab", "results", n) for n in names) if os.path.isdir(p)]


def mini_runs(folders):
    runs = {}
    for folder in folders:
        with contextlib.redirect_stdout(io.StringIO()):
            for arm, rs in summarize_mini.load_runs(folder).items():
                runs.setdefault(arm, []).extend(rs)
    return runs


SHORT = {"matched-flops": "matched FLOPs", "matched-params": "matched params", "ds-beyond-horizon": "deep sup. 4x",
         "ds-nominal": "deep sup. 1x", "rk4-vs-euler": "RK4 vs Euler", "heun-vs-euler": "Heun vs Euler",
         "srvit-r2": "SR-ViT", "init-structured-vs-pytorch": "structured init",
         "init-structured-vs-mimetic": "mimetic vs structured init",  # (a - b: a = mimetic)
         "replication-matched-flops": "matched FLOPs", "replication-matched-params": "matched params",
         "replication-ds-beyond-horizon": "deep sup. 4x", "replication-width-trend": "width trend",
         "crossroads-blackbox-costs": "black-box cost > 0", "crossroads-blackbox-costs-few": "black-box cost",
         "crossroads-rk4-gain-not-uniform": "RK4 not uniform", "crossroads-heun-gain-not-uniform": "Heun not uniform",
         "bvit-width-trend-mini": "width trend", "revit-e4-vs-moeut": "E=4 vs MoEUT", "revit-smear-near-e4":
         "SMEAR near E=4", "elastic-beats-0.5x": "elastic beats fixed at 0.5x", "revit-distill-control":
         "distillation control", "fig2-near-best-at-2L": "Fig. 2 near-best-at-2L"}


BOUND = {"fig2-near-best-at-2L": "Fig. 2: 2 L at most 1 point below 4/3 L", "crossroads-blackbox-costs-few":
         "black-box cost at most 5 points", "ds-nominal": "deep sup. 1x gains at most 1 point", "rk4-vs-euler":
         "RK4 over Euler at most 1 point", "heun-vs-euler": "Heun over Euler at most 1 point",
         "init-structured-vs-mimetic": "mimetic over structured init at most 0.5 points"}


def label(c):
    """A claim's short name as its table words its kind: a one-sided bound says its bound ("at most N points"), so
    a "<=" verdict never reads as an agreement without it (issue 77)."""
    name = SHORT.get(c.key, c.key)
    if c.kind == "<=":
        return BOUND.get(c.key, f"{name}: a - b at most {c.margin:g}")
    return f"{name} within ±{c.margin:g}" if c.kind == "~" else name


QUIET = ("mechanism at work", "signature holds")  # (what a headline leaves to its table)


def said(c, mean, half, v, drop=()):
    """'label verdict (a - b ± the smallest difference the seeds resolve[; notes])' of one judged claim: the notes
    of the verdict (claims.judge) but QUIET ones, ", gate fixed after the runs" (said once by the bullet) and
    those starting with any of `drop`."""
    if mean is None:
        return f"{label(c)} not run"
    notes = [n.strip(" ()").replace(", gate fixed after the runs", "") for n in v[len(plain(v)):].split(" (")]
    notes = [n for n in notes if n and n not in QUIET and not n.startswith(tuple(drop) or ("\0",))]
    spread = "" if half == float("inf") else f" ± {half:.2f}"
    return f"{label(c)} {plain(v)} ({mean:+.2f}{spread}" + "".join(f"; {n}" for n in notes) + ")"


def plain(verdict):
    """A verdict without its notes: 'cannot tell (2 of 3 seeds)' -> 'cannot tell'."""
    return verdict.split(" (")[0].split(",")[0].split(";")[0]


def both(parts):
    """'(a)-(d) cannot tell' when every part has one verdict, else the parts grouped by verdict, the smaller groups
    first (ties in the order they first come): '(a) agree, (c) disagree, (b, d) cannot tell'."""
    said_ = [(k, plain(v)) for k, v in parts]
    if len({v for _, v in said_}) == 1:
        return f"{said_[0][0]}-{said_[-1][0]} {said_[0][1]}" if len(said_) > 1 else f"{said_[0][0]} {said_[0][1]}"
    groups = {}  # verdict -> its parts, in order
    for k, v in said_:
        groups.setdefault(v, []).append(k)
    name = lambda ks: ks[0] if len(ks) == 1 else "(" + ", ".join(k.strip("()") for k in ks) + ")"  # noqa: E731
    return ", ".join(f"{name(ks)} {v}" for v, ks in sorted(groups.items(), key=lambda g: len(g[1])))


def tally(parts, prefix):
    """'6 claims cannot tell' when every part has one verdict, else the other verdicts by name (less
    `prefix`) before the count of the commonest: 'near-best-at-2L agree; 5 others cannot tell'."""
    said_ = [(k[len(prefix):] if k.startswith(prefix) else k, plain(v)) for k, v in parts]
    common = collections.Counter(v for _, v in said_).most_common(1)[0][0]
    rest = [f"{k} {v}" for k, v in said_ if v != common]
    same = [k for k, v in said_ if v == common]
    last = f"{len(same)} {'others' if rest else 'claims'} {common}" if len(same) > 1 else f"{same[0]} {common}"
    return "; ".join(rest + [last])


def brief(cs, v):
    """The claims `cs` whose verdict is not "cannot tell" in full (said()), then the count of the others: '...; deep
    sup. 4x agree (+12.05 ± 0.55); 6 others cannot tell'."""
    named = [said(c, *v[c.key]) for c in cs if plain(v[c.key][2]) != "cannot tell"]
    rest = sum(plain(v[c.key][2]) == "cannot tell" for c in cs)
    return "; ".join(named + ([f"{rest} {'others' if named else 'claims'} cannot tell"] if rest else []))


@functools.cache
def verdicts():
    """{claim key: (mean, half-width, verdict in words)} of every registered claim a summarizer judges over the kept
    runs (lab/results/), and what the headlines say beside them: {"fig2 falls": words, "search": (engaged, tried)}."""
    out, extra = {}, {}
    runs = mini_runs(kept("mini", "init"))
    for c in registry.claims_of("mini", "init"):
        out[c.key] = registry.judge(c, *summarize_mini.paired(c, runs))
    revit = mini_runs(kept("revit"))
    for c in registry.claims_of("revit"):
        out[c.key] = registry.judge(c, *summarize_mini.paired(c, revit))
    rec = registry.mean_record([r.get("last") for r in revit.get("revit-e4", [])])
    extra["idle"] = registry.reading(registry.claims_of("revit")[0], rec)
    search = mini_runs(kept("revit-search"))  # (the engagement search: one seed per candidate recipe)
    records = [registry.mean_record([r.get("last") for r in rs]) for rs in search.values()]
    extra["search"] = (sum(bool(registry.engaged(registry.REVIT_E4_ENGAGED, r)) for r in records), len(search))
    rep = kept("replication")
    out.update({c.key: (None, None, "not run") for c in registry.claims_of("replication")})
    if rep:
        rruns = mini_runs(rep)
        rruns = {arm: [r for r in rs if r["seed"] in registry.FRESH] for arm, rs in rruns.items()}
        for c in registry.claims_of("replication"):
            if registry.CONTRAST not in c.a:
                out[c.key] = registry.judge(c, *summarize_mini.paired(c, rruns))
    import summarize_untested
    with contextlib.redirect_stdout(io.StringIO()):
        ur = summarize_untested.read(kept("untested") + kept("mini")) if kept("untested") else {}
    for c in summarize_untested.CLAIMS:
        _, _, mean, half, v, _ = summarize_untested.judge(c, ur)
        out[c.key] = (mean, half, v)
    width = next(c for c in registry.claims_of("replication") if registry.CONTRAST in c.a)
    if rep:
        with contextlib.redirect_stdout(io.StringIO()):
            wr = summarize_untested.read(rep)
        _, _, mean, half, v, _ = summarize_untested.judge(width, wr)
        out[width.key] = (mean, half, v)
    else:
        out[width.key] = (None, None, "not run")
    pol = kept("anytime-policy")
    out.update({c.key: (None, None, "not run") for c in registry.CLAIMS if c.study == "anytime-policy"})
    if pol:
        import summarize_anytime_policy
        for key, _, v, mean, half in summarize_anytime_policy.claims(summarize_anytime_policy.load_runs(pol[0])):
            out[key] = (mean, half, v)
    fig2 = kept("revit-fig2")
    if fig2:
        import summarize_fig2
        fr = summarize_fig2.load_runs(fig2[0])
        for c in registry.claims_of("fig2"):
            here, resolves, v = summarize_fig2.judge(c, fr)
            mean = float(here.split("(")[-1].split(",")[0]) if here else None
            out[c.key] = (mean, float(resolves) if resolves else float("inf"), v)
        extra["fig2 falls"] = summarize_fig2.falls(fr)
    return out, extra


def lines():
    """The headline bullets: the replication fixed in advance, the confirmatory verdicts with the count of agrees
    chance alone would give, then the exploratory ones (a part fixed after their runs), one bullet per study."""
    out = []
    v, extra = verdicts()
    by = {c.key: c for c in registry.CLAIMS}
    text = lambda key: said(by[key], *v[key])  # noqa: E731
    rep = [c.key for c in registry.claims_of("replication")]
    out.append(f"**Replication fixed in advance** (seeds {'-'.join(map(str, registry.FRESH[::2]))}, every part registered at "
               f"{registry.REPLICATION.split()[-1]} before its runs; {LINK['replication']}): "
               + "; ".join(text(k) for k in rep) + ".")
    firm = [c for c in registry.CLAIMS if c.key in v and not registry.exploratory(c)
            and c.study not in ("replication", "anytime-policy")]  # (each has its own bullet)
    judged = [c for c in registry.CLAIMS if c.key in v and not registry.exploratory(c) and v[c.key][0] is not None]
    agrees = sum(plain(v[c.key][2]) == "agree" for c in judged)
    chance, n = registry.chance_agrees(judged)
    fig2 = [c for c in firm if c.study == "fig2"]
    fig2_text = "; ".join(text(c.key).replace("Fig. 2: ", "") for c in fig2 if plain(v[c.key][2]) != "cannot tell")
    rest = len([c for c in fig2 if plain(v[c.key][2]) == "cannot tell"])
    falls = extra.get("fig2 falls")
    out.append("**Confirmatory** (every part fixed before its runs): " + "; ".join(
        text(c.key) for c in firm if c.study != "fig2") + (f"; Fig. 2 (second regime, linear probe): {fig2_text}"
        + (f", yet the probe falls beyond 2/3 L ({falls})" if falls else "") + f"; {rest} others cannot tell"
        if fig2 else "") + f". {agrees} agree of {n} confirmatory verdicts; about {chance:.1f} expected by chance alone.")
    keys = ("matched-flops", "ds-beyond-horizon", "ds-nominal", "rk4-vs-euler", "heun-vs-euler", "srvit-r2",
            "init-structured-vs-pytorch", "init-structured-vs-mimetic")
    out.append(f"**Exploratory** (a part fixed after a run that judges it, gates included: [timelines][timeline]): "
               f"Training Crossroads, SoftMoR, init: " + brief([by[k] for k in keys if registry.exploratory(by[k])], v)
               + f" ({LINK['mini']}).")
    rv = [c for c in registry.claims_of("revit")]
    named = [said(c, *v[c.key], drop=("mechanism", "2 of 3")) for c in rv
             if plain(v[c.key][2]) not in ("cannot tell", "not run")]
    unsure = sum(plain(v[c.key][2]) == "cannot tell" for c in rv)
    none = [label(c) for c in rv if v[c.key][0] is None]
    on, tried = extra["search"]
    idle = extra["idle"].replace("mechanism not at work: ", "").replace(", gate fixed after the runs", "")
    seeds = {n for c in rv for n in v[c.key][2].split(" (")[1:] if " of 3 seeds" in n}
    out.append(f"**reViT, supervised** (exploratory{', ' + seeds.pop().strip(')') + ' each' if len(seeds) == 1 else ''}): "
               + "; ".join(named) + f"; {unsure} others cannot tell; "
               + ", ".join(none) + " not run; E=4's experts idle in every run (" + idle + "; gate fixed after the runs)"
               + f", {on} of {tried} recipes searched engage (one seed each) ({LINK['revit']}).")
    import summarize_anytime
    import summarize_loopvae
    import summarize_teacher
    teacher = kept("revit-teacher")
    if teacher:
        rows = summarize_teacher.claims(summarize_teacher.load_runs(teacher[0]))
        fails = [r[0][:3] for r in rows if "fails on every seed" in r[3]]
        out.append("**reViT's second regime** (exploratory): " + both([(r[0][:3], r[3]) for r in rows])
                   + "".join(f"; {k}'s universal claim fails on every seed" for k in fails) + f" ({LINK['teacher']}).")
    mini = kept("mini")
    if mini:
        rows = summarize_anytime.claims(summarize_anytime.load_runs(mini[0]))
        out.append("**Anytime inference** (ours): " + policy_said(v) + "; exploratory: " + both([(r[0][:3], r[2]) for r in rows])
                   + " ((a) chosen on the images it is scored on; bvit = odevit-euler, counted once) "
                   f"({LINK['anytime']}).")
    untested = [c for c in registry.claims_of("untested") if c.key in v]
    out.append("**Never tested before** (exploratory: partner runs repeat runs made before the claims): "
               + brief(untested, v) + f" ({LINK['untested']}).")
    loop = kept("loopvae")
    if loop:
        rows = summarize_loopvae.claims(summarize_loopvae.load_runs(loop[0]), None)
        cores = [(core, sorted({plain(r[3]) for r in rows if r[0].startswith(f"1. sharing, {core} core")}))
                 for core in ("CNN", "Transformer")]
        comp = by["loopvae-sharing-vit-competitive"]
        said_ = next(plain(r[3]) for r in rows if r[0].startswith("1'. sharing"))  # (its fresh seeds' verdict)
        out.append("**LoopVAE's sharing** (exploratory): " + ", ".join(f"{core} {' / '.join(vs)}" for core, vs in cores if vs)
                   + " (Transformer: signature not measured; its '>' misregistered: the paper says 'competitive', a "
                   f"'~' claim registered at {comp.registered.split()[-1]} for seeds 3-5, {said_}) ({LINK['loopvae']}).")
    return out


def policy_said(v):
    """The calibrated exit policy's claims (issue 80) as its table says them: 'certified policy (seeds 3-5, registered
    before its runs): violations at most delta cannot tell on bvit, bvit-ds (2 of 3 seeds), ... not run; ...'."""
    arms = registry.ANYTIME_ARMS
    risk = {a: v[f"anytime-policy-risk-{a}"] for a in arms}
    groups = {}
    for a in arms:
        groups.setdefault(plain(risk[a][2]), []).append(a)
    seeds = sorted({n for a in arms for n in risk[a][2].split(" (")[1:] if "seeds" in n})
    said_risk = ", ".join(f"{verdict} on {', '.join(a_)}" for verdict, a_ in groups.items())
    saves, wall = v["anytime-policy-saves-ds"], v["anytime-policy-wall-256"]
    part = lambda words, x, unit, base: (f"{words} not run" if x[0] is None else  # noqa: E731
                                         f"{words} {plain(x[2])} ({x[0] + base:.{1 if '%' in unit else 2}f}{unit})")
    return (f"certified exit (seeds {'-'.join(map(str, registry.ANYTIME_SEEDS[::2]))}, registered first"
            + (f"; {seeds[0].strip(')')}" if len(seeds) == 1 else "") + f"): splits over eps at most delta {said_risk}; "
            + part("bvit-ds saves >= 30 % at eps 1 %", saves, " %", 30.0) + ", "
            + part("faster at batch 256", wall, "x", 1.0))


def replication_block(v):
    """The replication's table (issue 77): each claim's words, arms, kind, the fresh seeds' verdict, beside the
    verdict of the same claim on the earlier seeds (which it does not replace)."""
    earlier = {"replication-matched-flops": "matched-flops", "replication-matched-params": "matched-params",
               "replication-ds-beyond-horizon": "ds-beyond-horizon", "replication-width-trend": "bvit-width-trend-mini"}
    rows = ["| claim | a vs b | depth | seeds 3-5: a - b | resolves | verdict | earlier seeds 0-2 (status) |",
            "|---|---|---|---|---|---|---|"]
    for c in registry.claims_of("replication"):
        mean, half, verdict_ = v[c.key]
        old = registry.CLAIMS[[k.key for k in registry.CLAIMS].index(earlier[c.key])]
        om, oh, ov = v.get(old.key, (None, None, "not run"))
        then = ("not run" if om is None else f"{plain(ov)} ({om:+.2f} ± {oh:.2f}; "
                + ("exploratory" if registry.exploratory(old) else "confirmatory") + ")")
        rows.append(f"| {c.words} ({c.paper}, {c.where}) | `{c.a}` vs `{c.b}` | {c.depth:g}x | "
                    + ("| | " if mean is None else f"{mean:+.2f} | {'-' if half == float('inf') else f'{half:.2f}'} | ")
                    + f"{verdict_} | {then} |")
    return "\n".join(rows)


def timeline_block():
    """Every registered claim's timeline (issue 77): when its words, arms and kind, margin, seeds, rule and gate were
    fixed (lab/claims.py timeline, from git), its first judging run, and whether it is confirmatory."""
    rows = ["| claim | words, arms, kind | margin | seeds | rule | gate | first judging run | status |",
            "|---|---|---|---|---|---|---|---|"]
    for c in registry.CLAIMS:
        t = registry.timeline(c)
        runs = registry.first_runs(c)
        first = min((d for _, _, _, d in runs), default=None)
        after = registry.fixed_after(c)
        status = ("exploratory: " + ", ".join(after) + " fixed after" if after else
                  "exploratory (registered so)" if c.exploratory else "confirmatory" if runs else "confirmatory, not run")
        if c.misregistered:
            status += "; misregistered"
        rows.append(f"| {c.key} | " + " | ".join(t.get(k, "-") for k in ("words, arms, kind", "margin", "seeds", "rule",
                                                                        "gate")) + f" | {first or '-'} | {status} |")
    return "\n".join(rows)


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--readme", help="write the lines between this file's <!-- headlines --> markers (README.md)")
    cli.add_argument("--results", help="write the replication and timeline tables between this file's markers "
                     "(lab/docs/results.md)")
    a = cli.parse_args(argv)
    text = "\n".join(textwrap.fill(f"- {line}", 158, subsequent_indent="  ", break_on_hyphens=False) for line in lines())
    if a.readme:
        summarize_mini.write_blocks(a.readme, {"headlines": text}, ROOT, tool="headlines.py", figures=())
    if a.results:
        v, _ = verdicts()
        summarize_mini.write_blocks(a.results, {"replication": replication_block(v), "timeline": timeline_block()},
                                    ROOT, tool="headlines.py", figures=())
    print(text)


if __name__ == "__main__":
    main()
