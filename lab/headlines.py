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
"untested": "[untested claims][untested]"}


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
         "init-structured-vs-mimetic": "mimetic vs structured init"}  # (a - b: a = mimetic)


def said(c, runs):
    """'label verdict (a - b ± the smallest difference the seeds resolve)' of one claim over summarize_mini's runs."""
    mean, half, v = registry.judge(c, *summarize_mini.paired(c, runs))
    label = SHORT.get(c.key, c.key)
    if mean is None:
        return f"{label} not run"
    return f"{label} {v.split(' (')[0]} ({mean:+.2f} ± {'-' if half == float('inf') else f'{half:.2f}'})"


UNTESTED = {"crossroads-blackbox-costs": "black-box cost", "crossroads-blackbox-costs-few": "a few points",
            "crossroads-rk4-gain-not-uniform": "RK4 not uniform", "crossroads-heun-gain-not-uniform": "Heun not uniform",
            "bvit-width-trend-mini": "width trend"}


def plain(verdict):
    """A verdict without its notes: 'cannot tell (2 of 3 seeds)' -> 'cannot tell'."""
    return verdict.split(" (")[0].split(",")[0]


def both(parts):
    """'(a)-(d) cannot tell' when every part has one verdict, else the parts grouped by verdict, the smaller groups
    first (ties in the order they first come): '(a) agree, (c) disagree, (b, d) cannot tell'."""
    said = [(k, plain(v)) for k, v in parts]
    if len({v for _, v in said}) == 1:
        return f"{said[0][0]}-{said[-1][0]} {said[0][1]}" if len(said) > 1 else f"{said[0][0]} {said[0][1]}"
    groups = {}  # verdict -> its parts, in order
    for k, v in said:
        groups.setdefault(v, []).append(k)
    name = lambda ks: ks[0] if len(ks) == 1 else "(" + ", ".join(k.strip("()") for k in ks) + ")"
    return ", ".join(f"{name(ks)} {v}" for v, ks in sorted(groups.items(), key=lambda g: len(g[1])))


def tally(parts, prefix):
    """'6 claims cannot tell' when every part has one verdict, else the other verdicts by name (less
    `prefix`) before the count of the commonest: 'near-best-at-2L agree; 5 others cannot tell'."""
    said = [(k[len(prefix):] if k.startswith(prefix) else k, plain(v)) for k, v in parts]
    common = collections.Counter(v for _, v in said).most_common(1)[0][0]
    rest = [f"{k} {v}" for k, v in said if v != common]
    same = [k for k, v in said if v == common]
    last = f"{len(same)} {'others' if rest else 'claims'} {common}" if len(same) > 1 else f"{same[0]} {common}"
    return "; ".join(rest + [last])


def lines():
    """The headline bullets, one per study."""
    out, exploratory = [], []  # (the exploratory claims stand apart, in a bullet of their own)
    runs = mini_runs(kept("mini", "init"))
    for title, keys in (("Training Crossroads", ("matched-flops", "matched-params", "ds-beyond-horizon", "ds-nominal",
                                                 "rk4-vs-euler", "heun-vs-euler")),
                        ("SoftMoR, structured init", ("srvit-r2", "init-structured-vs-pytorch",
                                                         "init-structured-vs-mimetic"))):
        cs = [c for c in registry.CLAIMS if c.key in keys]
        out.append(f"**{title}:** " + "; ".join(said(c, runs) for c in cs if not c.exploratory) + f" ({LINK['mini']}).")
        exploratory += [said(c, runs) for c in cs if c.exploratory]
    exploratory[-1] += f" ({LINK['mini']})"
    revit = mini_runs(kept("revit"))
    vs = [registry.judge(c, *summarize_mini.paired(c, revit))[2] for c in registry.claims_of("revit")]
    idle = sum(v.startswith("not engaged") for v in vs)
    search = mini_runs(kept("revit-search"))  # (the engagement search: one seed per candidate recipe)
    records = [registry.mean_record([r.get("last") for r in rs]) for rs in search.values()]
    on = sum(bool(registry.engaged(registry.REVIT_E4_ENGAGED, rec)) for rec in records)
    tried = f"; {on} of {len(search)} recipes searched engage" if search else ""
    out.append(f"**reViT, supervised:** {idle} of {len(vs)} claims not engaged at this scale: "
               f"E=4's experts stay idle (eq. 6, eq. 9){tried} ({LINK['revit']}).")
    import summarize_anytime
    import summarize_loopvae
    import summarize_teacher
    teacher, regime = kept("revit-teacher"), "**reViT's second regime:** not run"
    if teacher:
        rows = summarize_teacher.claims(summarize_teacher.load_runs(teacher[0]))
        regime = ("**reViT's second regime:** "
                  + both([(r[0][:3], r[3]) for r in rows]) + f" ({LINK['teacher']})")
    fig2 = kept("revit-fig2")
    if fig2:
        import summarize_fig2
        fr = summarize_fig2.load_runs(fig2[0])
        fig2_said = [(c.key, summarize_fig2.judge(c, fr)[2]) for c in registry.claims_of("fig2")]
        verdicts = "not run yet" if all(v == "not run" for _, v in fig2_said) else tally(fig2_said, "fig2-")
        out.append(regime + f"; **Fig. 2**: {verdicts}.")
    else:
        out.append(regime + "; **Fig. 2**: not run yet.")
    mini = kept("mini")
    if mini:
        rows = summarize_anytime.claims(summarize_anytime.load_runs(mini[0]))
        out.append("**Anytime inference** (ours): " + both([(r[0][:3], r[2]) for r in rows])
                   + f" ({LINK['anytime']}).")
    untested = kept("untested")
    if untested:  # issue 64's claims: their runs, with the partners' seeds kept in lab/results/mini
        import summarize_untested
        with contextlib.redirect_stdout(io.StringIO()):
            ur = summarize_untested.read(untested + kept("mini"))
        said_ = [(UNTESTED.get(c.key, c.key), summarize_untested.judge(c, ur)[4]) for c in summarize_untested.CLAIMS]
        out.append(f"**Never tested before** (Training Crossroads, bViT): {tally(said_, '')} ({LINK['untested']}).")
    loop = kept("loopvae")
    if loop:
        rows = summarize_loopvae.claims(summarize_loopvae.load_runs(loop[0]), None)
        cores = [(core, sorted({r[3].split(" (")[0] for r in rows if r[0].startswith(f"1. sharing, {core} core")}))
                 for core in ("CNN", "Transformer")]
        exploratory.append("LoopVAE's sharing: " + ", ".join(f"{core} {' / '.join(vs)}" for core, vs in cores if vs)
                           + f" ({LINK['loopvae']})")
    out.append("**Exploratory:** " + "; ".join(exploratory) + ".")
    return out


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--readme", help="write the lines between this file's <!-- headlines --> markers (README.md)")
    a = cli.parse_args(argv)
    text = "\n".join(textwrap.fill(f"- {line}", 158, subsequent_indent="  ", break_on_hyphens=False) for line in lines())

    if a.readme:
        summarize_mini.write_blocks(a.readme, {"headlines": text}, ROOT, tool="headlines.py", figures=())
    print(text)


if __name__ == "__main__":
    main()
