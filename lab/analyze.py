"""Look inside a trained rvits checkpoint: depthwise self-CKA and what the recurrent block does at each step.

    python lab/analyze.py --resume runs/bvit/ckpt.pt --out-dir runs/bvit/analysis [--num-images 512]
        [--data-dir ../shared/data] [--device cpu|cuda] [--depth L] [--batch-size 128]
    python lab/analyze.py --resume CKPT --out-dir OUT --teacher TEACHER [--draws 8]
    python lab/analyze.py --resume CKPT --out-dir OUT --anytime [--budget L]
    python lab/analyze.py --resume CKPT --ranks [--depth L]          # reViT: ranks.json beside CKPT, and a table

The model is rebuilt from the run's saved flags through train.py's registry (training/registry.py) and
evaluated on the first N images of the validation set it was trained on (no augmentation). One question
per command; the measures live in lab/analysis/ (its __init__.py lists them), this file is the command line:
    (default)   what does the block do at each step? (lab/analysis/steps.py) OUT/cka.json: depthwise
                self-CKA of the mean patch tokens (reViT: its gate table); OUT/steps.json: per step the
                token norm, each head's attention entropy and distance, top-1 with the step skipped.
    LoopVAE     does LoopVAE use its loops? (lab/analysis/loops.py) A tokenizer checkpoint gets OUT/loops.json
                instead: PSNR after each prefix of every stage, and lost per bypassed pass.
    --teacher   does a distilled student follow its teacher's depth? (lab/analysis/alignment.py; FILE an
                rvits checkpoint or a timm-layout ViT file, run as --teacher runs in train.py):
                OUT/alignment.json, the cross-CKA map, its path, and (reViT, E > 1) expert deletions
                and gate permutations scored by teacher CKA.
    --anytime   can each image stop when it is done? (lab/analysis/anytime.py): OUT/anytime.json, top-1
                against mean block applications per exit rule, beside fixed depth and the oracle.
    --ranks     how fully does a reViT use its expert bank? (lab/analysis/ranks.py; reViT sec. 5.2, App. D): the
                effective ranks of the expert W1 bank, the gates and the merged W1, also depth-centered, from
                the weights alone (no images): ranks.json beside the checkpoint (or in --out-dir), a table.
Each JSON gets a PNG beside it when matplotlib is installed. Any bad input is one line
`analyze.py: error: ...` and exit status 2.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the product beside the lab

import torch

import data
from analysis import alignment, anytime, loops, ranks, steps
from loopvae_train import flags as lvflags
from training import flags, registry
from training.weights import read_weights
from training.evaluation import depth_problem
from training.exits import Fail, printable_output
from training.figures import pyplot


class Parser(argparse.ArgumentParser):
    def error(self, message):  # cli() prints it as one line with exit status 2
        raise Fail(message)


def get_parser():
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resume", required=True, metavar="CKPT", help="an rvits checkpoint (train.py's ckpt.pt)")
    p.add_argument("--out-dir", help="where cka.json, steps.json (LoopVAE: loops.json) and PNGs are written "
                   "(required, except with --ranks: default the checkpoint's folder)")
    p.add_argument("--num-images", type=flags.positive(int), default=512, help="first N validation images")
    p.add_argument("--data-dir", help="dataset root (default: the checkpoint's --data-dir)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--depth", type=flags.positive(int), help="steps to run (default: the trained depth)")
    p.add_argument("--batch-size", type=flags.positive(int), default=128)
    p.add_argument("--teacher", metavar="FILE", help="instead: the teacher-alignment analyses against this rvits "
                   "checkpoint or timm-layout ViT file (reViT App. D): alignment.json and alignment.png")
    p.add_argument("--draws", type=flags.positive(int), default=8, help="with --teacher: random gate "
                   "perturbations per expert deletion")
    p.add_argument("--anytime", action="store_true", help="instead: per-image early exit (lab/analysis/anytime.py): "
                   "top-1 against mean block applications per rule, beside fixed depth and the oracle, and the "
                   "per-step diagnostics (anytime.json, anytime.png)")
    p.add_argument("--budget", type=flags.positive(int), help="with --anytime: the step budget, at most 8x the "
                   "trained depth (default: twice the trained depth where a step does not depend on the budget: "
                   "one-block bvit, srvit, odevit without refine; else the trained depth)")
    p.add_argument("--ranks", action="store_true", help="instead (reViT): the effective ranks of its expert W1 bank, "
                   "gates and merged W1, also depth-centered (reViT sec. 5.2, App. D; lab/analysis/ranks.py), from the "
                   "weights alone: ranks.json beside the checkpoint, and a table")
    return p


# ----------------------------------------------------------------------------- model and data
def load(args):
    """(model on args.device in eval mode, validation set, the run's saved flags) of the
    checkpoint args.resume, built as train.py builds it: the saved flags over train.py's parser
    defaults, training.flags.resolve, then training.registry.build_model (LoopVAE: train_loopvae.py's,
    loopvae_train/flags.py)."""
    ck = read_weights(args.resume, "--resume")  # weights_only: a pickled object is refused
    known = [*registry.MODELS, "loopvae"]
    if not (isinstance(ck, dict) and isinstance(ck.get("model"), dict) and isinstance(ck.get("args"), dict)
            and ck["args"].get("model") in known):
        raise Fail(f"--resume {args.resume}: not an rvits checkpoint (a dict with the model weights "
                         f"under 'model' and the run's flags under 'args', --model one of {', '.join(known)})")
    tokenizer = ck["args"]["model"] == "loopvae"
    run = (lvflags.get_parser() if tokenizer else flags.get_parser()).parse_args([])
    vars(run).update(ck["args"], teacher=None, distill=None, perceptual="none")  # training-only: an analysis
    # distils nothing and needs no LoopVAE loss term (whose LPIPS weights an offline machine lacks)
    if args.data_dir:
        run.data_dir = args.data_dir
    try:
        _, val_set, num_classes, img_size = data.build_datasets(
            run.data, run.data_dir, run.img_size, seed=run.seed, val_labels=run.val_labels,
            # as the run saw its images (LoopVAE: [-1, 1], a tokenizer's crops)
            **(dict(mean_std=lvflags.NORMALIZATION, reconstruct=True) if tokenizer else
               dict(mean_std=registry.MODELS[run.model].normalization)))
    except (data.DataError, ValueError) as e:
        raise Fail(f"{e} (the checkpoint's data; give --data-dir to read it elsewhere)")
    if tokenizer:
        run = lvflags.resolve(run, get_parser(), img_size)
        model = lvflags.build_model(run, img_size)
    else:
        run = flags.resolve(run, get_parser(), img_size)
        model = registry.build_model(run, img_size, num_classes)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise Fail(f"--resume {args.resume}: its weights do not fit the model its flags describe "
                   f"({str(e).strip().splitlines()[-1].strip()})")
    return model.to(args.device).eval(), val_set, run




STEP_MEANING = {
    "odevit": "one solver step ({c} block evaluations); state = the solver's z(t_k)",
    "srvit": "one recursion through the {c}-layer stack; state = h_r before the token mixture",
}


def finite(v):
    """v (a float or nested lists of floats) with every nan / inf as None: JSON has no NaN, and an undefined
    CKA (a constant representation) is written as null."""
    return [finite(u) for u in v] if isinstance(v, list) else (v if math.isfinite(v) else None)


def write(res, checkpoint, out_dir):
    """OUT/cka.json, OUT/steps.json and, with matplotlib, OUT/cka.png and OUT/steps.png."""
    L, name = res["depth"], res["model"]
    layers = ["embed"] + [f"step {k}" for k in range(1, L + 1)]
    cka = {"cka": finite(res["cka"]), "layers": layers, "checkpoint": checkpoint,
           "num_images": res["num_images"], "model": name, "depth": L}
    if "gates" in res:
        cka["gates"] = [[round(g, 4) for g in row] for row in res["gates"]]
    if "lora_norms" in res:
        cka["lora_norms"] = res["lora_norms"]
    rows = []
    for k in range(L):
        row = {"step": k + 1, "act_norm": res["act_norm"][k + 1], "attn_entropy": res["attn_entropy"][k],
               "attn_distance": res["attn_distance"][k], "top1_skip": res["top1_skip"][k]}
        if "gates" in res:
            row["gates"] = res["gates"][k]
        if "mix_weights" in res:
            row["mix_weight"] = res["mix_weights"][k]
        rows.append(row)
    meaning = STEP_MEANING.get(name, "one block application; state = the block's output")
    steps = {"checkpoint": checkpoint, "model": name, "depth": L, "num_images": res["num_images"],
             "step": meaning.format(c=res["calls_per_step"]), "calls_per_step": res["calls_per_step"],
             "top1": res["top1"], "embed_act_norm": res["act_norm"][0], "tokens": res["tokens"],
             "max_entropy": math.log(res["tokens"]), "patch_size": res["patch_size"], "steps": rows}
    os.makedirs(out_dir, exist_ok=True)
    for fname, obj in (("cka.json", cka), ("steps.json", steps)):
        with open(os.path.join(out_dir, fname), "w") as f:
            json.dump(obj, f, indent=1)
    plt = pyplot(os.path.join(out_dir, "cka.png"), os.path.join(out_dir, "steps.png"))
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5 + 0.2 * L, 4 + 0.2 * L))
    im = ax.imshow(torch.tensor(res["cka"]).numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.set_xticks(range(L + 1), ["embed"] + list(range(1, L + 1)))
    ax.set_yticks(range(L + 1), ["embed"] + list(range(1, L + 1)))
    ax.set(xlabel="step", ylabel="step", title=f"{name}: linear CKA of mean patch tokens (n={res['num_images']})")
    fig.colorbar(im, ax=ax)
    fig.savefig(os.path.join(out_dir, "cka.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    k = list(range(1, L + 1))
    fig, ax = plt.subplots(2, 2, figsize=(11, 8), layout="constrained")
    ax[0, 0].plot(range(L + 1), res["act_norm"], "o-")
    ax[0, 0].set(xlabel="step (0 = embedding)", ylabel="mean token norm", title="activation norm")
    for h, (e, d) in enumerate(zip(zip(*res["attn_entropy"]), zip(*res["attn_distance"]))):
        ax[0, 1].plot(k, e, "o-", label=f"head {h}")
        ax[1, 0].plot(k, d, "o-", label=f"head {h}")
    ax[0, 1].axhline(math.log(res["tokens"]), color="gray", ls="--", label="uniform (log T)")
    ax[0, 1].set(xlabel="step", ylabel="nats", title="attention entropy per head")
    ax[1, 0].set(xlabel="step", ylabel="patches", title="mean attention distance per head")
    ax[1, 1].bar(k, res["top1_skip"], label="step k skipped")
    ax[1, 1].axhline(res["top1"], color="k", ls="--", label=f"no step skipped ({res['top1']:.1f}%)")
    ax[1, 1].set(xlabel="skipped step k", ylabel="top-1 (%)", title="step-specific pruning")
    for a in (ax[0, 1], ax[1, 0], ax[1, 1]):
        a.legend(fontsize=7)
    fig.suptitle(f"{name}, {checkpoint}: {steps['step']} (n={res['num_images']})", fontsize=9)
    fig.savefig(os.path.join(out_dir, "steps.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_loops(res, checkpoint, out_dir):
    """OUT/loops.json (loop_interventions' dict), and OUT/loops.png, PSNR after each prefix of every
    multi-pass stage, when matplotlib is installed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "loops.json"), "w") as f:
        json.dump({"checkpoint": checkpoint, **res}, f, indent=1)
    plt = pyplot(os.path.join(out_dir, "loops.png"))
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, psnrs in res["prefix"].items():
        ax.plot(range(1, len(psnrs) + 1), psnrs, "o-", label=name)
    ax.set(xlabel="passes kept (k)", ylabel="PSNR (dB)", title=f"LoopVAE: completing the schedule (n={res['num_images']})")
    ax.legend(fontsize=7)
    fig.savefig(os.path.join(out_dir, "loops.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    """analyze.py with the arguments argv (None: sys.argv): --teacher, --anytime, a LoopVAE checkpoint's loops
    or, by default, CKA and the per-step analyses, written under --out-dir; Fail for a bad input."""
    args = get_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda: no CUDA device is available; use --device cpu")
    if args.budget and not args.anytime:
        raise Fail(f"--budget {args.budget}: the step budget of --anytime; add --anytime or drop --budget")
    if args.ranks:
        return main_ranks(args)
    if not args.out_dir:
        raise Fail("the following arguments are required: --out-dir")
    model, val_set, run = load(args)
    too_deep = args.depth and run.model in registry.MODELS and depth_problem("--depth", [args.depth], run)  # (LoopVAE:
    # its loops; refused below)
    if too_deep:
        raise Fail(too_deep)
    if args.teacher:
        return main_alignment(args, model, val_set, run)
    if args.anytime:
        return main_anytime(args, model, val_set, run)
    if run.model == "loopvae":  # a tokenizer: its loops (sec. 4.4), not CKA and per-step statistics
        if args.depth is not None:
            raise Fail(f"--depth {args.depth}: {args.resume} is a LoopVAE checkpoint, analysed at its trained loops "
                       "(every pass, truncated and bypassed); leave out --depth")
        n = min(args.num_images, len(val_set))
        images = torch.stack([val_set[i][0] for i in range(n)]).to(args.device)
        res = loops.loop_interventions(model, images, args.batch_size)
        try:
            write_loops(res, args.resume, args.out_dir)
        except OSError as e:
            raise Fail(f"--out-dir {args.out_dir} cannot be written ({e.strerror})")
        print(f"PSNR {res['full']['psnr']:.2f} dB on {n} images; most sensitive pass per stage: "
              + ", ".join(f"{k} {v}" for k, v in res["most_sensitive"].items()) + f"; wrote {args.out_dir}/loops.json")
        return
    try:
        res = steps.analyze(model, run.model, val_set, args.num_images, args.depth, args.batch_size, args.device)
    except ValueError as e:  # e.g. a depth the model cannot run
        raise Fail(f"--depth {args.depth}: {e}")
    try:
        write(res, args.resume, args.out_dir)
    except OSError as e:
        raise Fail(f"--out-dir {args.out_dir} cannot be written ({e.strerror})")
    print(f"top-1 {res['top1']:.2f}% on {res['num_images']} images; skipping step k: "
          + " ".join(f"{v:.1f}" for v in res["top1_skip"]) + f"; wrote {args.out_dir}/cka.json, steps.json")


def save(res, out_dir, name, plot):
    """OUT/NAME.json and, with matplotlib, OUT/NAME.png (plot(res, path)); Fail for a folder that cannot
    be written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
        plot(res, os.path.join(out_dir, f"{name}.png"))
    except OSError as e:
        raise Fail(f"--out-dir {out_dir} cannot be written ({e.strerror})")


def main_alignment(args, model, val_set, run):
    """analyze.py --teacher: alignment.alignment() of the checkpoint against the teacher, written as
    alignment.json (+ alignment.png: the cross-CKA map with its maximum-CKA path and the proportional diagonal)."""
    if run.model == "loopvae" or steps.step_structure(model, run.model, None)[1:] != (1, False):
        # (a step must be one block call, its state the block's output: not a recursion or a solver step)
        raise Fail(f"--teacher: the alignment analyses read one state per step, a block's output (vit, bvit, revit); "
                   f"{args.resume} is --model {run.model}")
    if args.depth is not None:
        raise Fail("--teacher: leave out --depth (the alignment analyses read the trained depth)")
    from training.distill import Distiller, teacher
    teacher_model, renorm, line = teacher(args.teacher, flags.get_parser(), model, run)
    teacher_model = teacher_model.to(args.device)
    to_teacher = Distiller(model, teacher_model, "feature", renormalize=renorm).to(args.device).teacher_input
    print(line)
    n = min(args.num_images, len(val_set))
    images = torch.stack([val_set[i][0] for i in range(n)]).to(args.device)
    res = alignment.alignment(model, teacher_model, to_teacher, images, args.batch_size, args.draws, run.seed)
    res.update(checkpoint=args.resume, teacher=args.teacher, num_images=n, model=run.model,
               experts=getattr(model, "experts", 1), cross=finite(res["cross"]))
    save(res, args.out_dir, "alignment", plot_alignment)
    extra = ""
    if "deletions" in res:
        perm = [p["teacher_cka"] for p in res["permutations"][1:]]
        extra = (f"; gate permutations {sum(v < res['teacher_cka'] for v in perm)} of {len(perm)} lower "
                 f"(mean {sum(perm) / len(perm):.3f})")
    print(f"teacher CKA {res['teacher_cka']:.3f}; max-CKA path rho {res['rho']:.3f}, MAD {res['mad']:.2f} layers"
          f"{extra}; wrote {args.out_dir}/alignment.json")




def main_ranks(args):
    """analyze.py --ranks: ranks.expert_ranks of a reViT checkpoint, from its weights alone (no data), written as
    ranks.json in --out-dir (default: the checkpoint's folder) and printed as a table."""
    if args.teacher or args.anytime:
        raise Fail(f"--ranks: one analysis per command; drop {'--teacher' if args.teacher else '--anytime'}")
    ck = read_weights(args.resume, "--resume")
    model = registry.model_from_checkpoint(ck, args.resume, "--resume", flags.get_parser(), None)
    too_deep = args.depth and depth_problem("--depth", [args.depth], ck["args"])
    if too_deep:
        raise Fail(too_deep)
    try:
        res = ranks.expert_ranks(model, args.depth)
    except ValueError as e:
        raise Fail(f"--ranks: {args.resume}: {e}")
    res.update(checkpoint=args.resume, model=type(model).__name__)
    out = args.out_dir or os.path.dirname(os.path.abspath(args.resume))
    save(res, out, "ranks", lambda res, path: None)
    E = res["experts"]
    print(f"effective ranks, reViT E={E}, L={res['depth']} (sec. 5.2; at most E = {E}, depth-centered E - 1 = {E - 1})")
    print(f"{'':18s}{'expert W1 bank':>16s}{'gates G':>10s}{'merged G W1':>13s}")
    print(f"{'as trained':18s}{res['bank']:16.2f}{res['gate']:10.2f}{res['merged']:13.2f}")
    print(f"{'depth-centered':18s}{'-':>16s}{res['gate_centered']:10.2f}{res['merged_centered']:13.2f}")
    print(f"wrote {os.path.join(out, 'ranks.json')}")


def main_anytime(args, model, val_set, run):
    """analyze.py --anytime: anytime_analysis of the checkpoint, written as anytime.json and anytime.png."""
    if run.model == "loopvae":
        raise Fail(f"--anytime: {args.resume} is a LoopVAE tokenizer; early exit reads a classifier's predictions")
    trained = registry.trained_depth(run)  # recursions for srvit, solver steps for odevit, else block applications
    # Past the trained depth by default only where step k does not depend on the budget's grid: one block
    # (bvit), a recursion (srvit), a solver step of a fixed size (odevit, extend
    # "time"); reViT's coordinates, bViT's phases and a refined ODE grid change with the budget.
    grid_free = (run.model == "bvit" and model.num_blocks == 1) or run.model == "srvit" \
        or (run.model == "odevit" and model.extend != "refine")
    budget = args.budget or (2 * trained if grid_free else trained)
    try:
        anytime.check(model, budget)
    except ValueError as e:
        raise Fail(f"--budget {budget}: {e}")
    if budget < trained:
        raise Fail(f"--budget {budget}: below the trained depth {trained}; the operating point is read against it")
    most = anytime.MAX_BUDGET
    if budget > most * trained:  # every fixed depth 1..budget is run too: the cost grows as budget^2
        raise Fail(f"--budget {budget}: at most {most}x the trained depth ({most * trained} steps)")
    res = anytime.anytime_analysis(model, val_set, args.num_images, budget, trained, args.batch_size, args.device)
    res.update(checkpoint=args.resume, model=run.model)
    save(res, args.out_dir, "anytime", plot_anytime)
    ops = ", ".join(f"{r} {v['operating_point']['fraction_of_trained']:.0%}" if v["operating_point"] else f"{r} -"
                    for r, v in res["rules"].items())
    print(f"full-depth top-1 {res['full_top1']:.2f} % at {trained} steps; block applications within {anytime.WITHIN} "
          f"points: {ops} of the trained depth's; oracle {res['oracle']['applications']:.2f} applications at "
          f"{res['oracle']['top1']:.2f} %; beyond the trained depth: {res['behaviour'] or 'not run'}; wrote "
          f"{args.out_dir}/anytime.json")


def plot_anytime(res, path):
    """anytime.png at `path` from anytime_analysis's dict `res` (nothing without matplotlib): top-1 against
    mean block applications per rule, fixed depth and the oracle; per step the readout's top-1 and residual."""
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    ax[0].plot([p["applications"] for p in res["fixed"]], [p["top1"] for p in res["fixed"]], "k.-", label="fixed depth")
    for rule, r in res["rules"].items():
        ax[0].plot([p["applications"] for p in r["curve"]], [p["top1"] for p in r["curve"]], ".-", ms=3, label=rule)
    ax[0].plot([res["oracle"]["applications"]], [res["oracle"]["top1"]], "r*", ms=10, label="oracle")
    ax[0].axhline(res["full_top1"] - anytime.WITHIN, color="gray", ls=":", lw=1)
    ax[0].set(xlabel="mean block applications per image", ylabel="top-1 (%)",
              title=f"{res['model']}: per-image exit (n={res['num_images']})")
    ax[0].legend(fontsize=7)
    k = range(1, res["budget"] + 1)
    ax[1].plot(k, res["per_step"]["top1"], "o-", label="readout top-1 (%)")
    ax[1].set(xlabel="step", ylabel="top-1 (%)", title=f"per step (trained depth {res['trained_depth']}; beyond: "
              f"{res['behaviour'] or '-'})")
    ax[1].axvline(res["trained_depth"], color="gray", ls=":", lw=1)
    tw = ax[1].twinx()
    tw.semilogy(k, res["per_step"]["residual"], "s--", color="tab:red", ms=3, label="residual RMS")
    tw.set_ylabel("RMS(h_k - h_{k-1})")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_alignment(res, path):
    """alignment.png at `path` from alignment.json's dict `res` (nothing without matplotlib): the cross-CKA
    map with its maximum-CKA path and the proportional diagonal."""
    plt = pyplot(path)
    if plt is None:
        return
    c = torch.tensor([[v if v is not None else float("nan") for v in row] for row in res["cross"]])
    ls, lt = c.shape[0] - 1, c.shape[1] - 1
    fig, ax = plt.subplots(figsize=(4 + 0.2 * lt, 4 + 0.2 * ls))
    im = ax.imshow(c.numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.plot(res["path"], range(1, ls + 1), "c.-", label=f"max-CKA path (rho {res['rho']:.3f}, MAD {res['mad']:.2f})")
    ax.plot(res["proportional"], range(1, ls + 1), "w--", lw=1, label="proportional depth")
    ax.set(xlabel="teacher layer (0 = embedding)", ylabel="student step (0 = embedding)",
           title=f"{res['model']} E={res['experts']} vs teacher: cross-CKA (n={res['num_images']})")
    ax.legend(fontsize=7, loc="upper left")
    fig.colorbar(im, ax=ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def cli(argv=None):
    """main(argv) with every user-fixable problem as one line on stderr and exit status 2."""
    printable_output("analyze.py")  # (a path on a stdout that cannot encode it: escaped; a failed write ends nothing)
    try:
        main(argv)
    except Fail as e:
        sys.stderr.write(f"analyze.py: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
