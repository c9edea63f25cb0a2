"""The anytime exit path's speed: evaluation img/s of the per-image exit path (lab/analysis/anytime.py, images
leave the batch) at each rule's operating point in DIR/anytime.json (lab/analyze.py --anytime: top-1 within 0.5
points of full depth) over the fixed-depth forward of the checkpoint DIR/ckpt.pt, on its first 512 validation
images. Timing as bench.py's: warm-up calls first, synchronize, median of timed repeats (bench.timed).

    python lab/bench_anytime.py DIR --json DIR/bench_anytime.json      # lab/summarize_anytime.py runs it

Keys: anytime_{rule}_over_fixed_img_per_s; the JSON also holds "errors" and "info", as bench.py's. Exit status: 0,
1 when the measurement failed (its FAILED line says why), 2 for bad input.
"""
import json
import os
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the product beside the lab
import torch  # noqa: E402

import bench  # noqa: E402
import kernels  # noqa: E402
from training import flags as run_flags  # noqa: E402  (the number types and one-line errors of every tool)


def get_parser():
    p = run_flags.Parser(prog="bench_anytime.py", description=__doc__.split("\n\n")[0])
    p.add_argument("anytime", metavar="DIR", help="a run folder with ckpt.pt and lab/analyze.py --anytime's "
                   "anytime.json (--out-dir DIR)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", help="also write the ratios to this JSON file (its folder is made if need be)")
    p.add_argument("--smoke", action="store_true", help="8 images, one repeat: checks that the script runs")
    return p


def check(p, args):
    """Refuse what cannot be timed, in one line each (p.error: exit status 2)."""
    if not os.path.isdir(args.anytime):
        p.error(f"{args.anytime}: no such folder; give a run folder that holds ckpt.pt and anytime.json")
    if not os.path.isfile(os.path.join(args.anytime, "ckpt.pt")):
        p.error(f"{args.anytime}: no ckpt.pt there (a run folder kept without its checkpoint, as in lab/results/, "
                "cannot be timed); give the folder of a run that holds one")
    from training.registry import ELSEWHERE
    try:  # its --model, from the args.json train.py writes beside ckpt.pt
        kind = json.load(open(os.path.join(args.anytime, "args.json"))).get("model")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind in ELSEWHERE:  # (analyze.py --anytime, which the line below names, refuses it)
        p.error(f"{args.anytime}: a --model {kind} run, a tokenizer; early exit reads a classifier's "
                "predictions: give the folder of a classifier's run")
    if not os.path.isfile(os.path.join(args.anytime, "anytime.json")):
        p.error(f"{args.anytime}: no anytime.json there; run lab/analyze.py --resume {args.anytime}/ckpt.pt "
                f"--anytime --out-dir {args.anytime} first")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")


def run(args):
    """Time the fixed-depth forward and the exit path at each rule's operating point; returns the errors
    ({} when it ran) and writes args.json (if given) as bench.py does."""
    import analyze
    from analysis import anytime
    device = torch.device(args.device)
    warmup, repeats = (1, 1) if args.smoke else (5, 20) if device.type == "cuda" else (2, 5)
    res, errors, info = {}, {}, dict(device=args.device, torch=torch.__version__)
    t_start = time.time()

    def write_json():
        if args.json:
            info["seconds"] = time.time() - t_start
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({**res, "errors": errors, "info": info}, f, indent=1)

    try:
        spec = json.load(open(os.path.join(args.anytime, "anytime.json")))
        model, val_set, _ = analyze.load(types.SimpleNamespace(resume=os.path.join(args.anytime, "ckpt.pt"),
                                                               data_dir=None, device=args.device))
        x = torch.stack([val_set[i][0] for i in range(min(512 if not args.smoke else 8, len(val_set)))]).to(device)
        with torch.no_grad():
            fixed = bench.timed(lambda: model(x), device, warmup, repeats)
        for rule, r in spec["rules"].items():
            op = r["operating_point"]
            if op is None:
                print(f"{'anytime_' + rule:40s}   no threshold keeps top-1 within 0.5 points", flush=True)
                continue
            t = bench.timed(lambda: anytime.run(model, x, rule, op["threshold"], spec["budget"]), device, warmup,
                            repeats)
            res[key := f"anytime_{rule}_over_fixed_img_per_s"] = fixed / t
            print(f"{key:40s} {fixed / t:8.3f}  threshold {op['threshold']:.4g}: {op['applications']:.2f} block "
                  f"applications per image against {spec['trained_depth']} x {spec['blocks_per_step']}, {len(x)} "
                  "images", flush=True)
    except Exception as e:  # noqa: BLE001 -- one line, as bench.py's measurements
        errors["anytime"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        print(f"{'anytime':40s}   FAILED  {errors['anytime']}", flush=True)
    write_json()
    return errors


def main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    check(p, args)
    try:
        return run(args)
    finally:
        kernels.release_compile_workers()


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
