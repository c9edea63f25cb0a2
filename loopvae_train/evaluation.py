"""LoopVAE's evaluation for train_loopvae.py: the reconstruction metrics of each epoch
(evaluate_reconstruction: PSNR, SSIM, L1, KL, out-of-range pixels, LPIPS, rFID), summed over the ranks
with training/evaluation.py's pieces, the line of an epoch (epoch_line) and the --eval-only report
(reconstruction_report).
"""
import json

import torch
import torch.distributed as dist

import loopvae
from training.evaluation import eval_batches, results_files, summed_over_ranks
from training.exits import Preempted, write
from training.monitor import epoch_line as classifier_line

RECONSTRUCTION = ("l1", "psnr", "psnr_raw", "ssim", "kl", "out_of_range")  # loopvae's metrics(), as logged


@torch.no_grad()
def evaluate_reconstruction(model, loader, device, amp_ctx, stop=None, rfid=None):
    """A tokenizer's validation metrics in eval mode (LoopVAE: the posterior mode decoded, `reconstruct`,
    then loopvae.reconstruction_metrics), means over the images of all ranks: val_l1 (mean |x - x_hat|
    in [-1, 1] units), val_psnr and val_psnr_raw (dB, output clipped to the valid range or not),
    val_ssim, val_kl (per latent element) and val_out_of_range (fraction of pixels); with `rfid`
    (rfid_metric) val_rfid, the FID of the clipped reconstructions against their images (App. A.3: the
    validation images are both the real set and the sources); with the model's perceptual network
    (--perceptual lpips: LPIPS-VGG) val_lpips, as Table 1 reports it. Raises EmptyEvaluation when no rank
    had a usable image; None once `stop` holds a request (as evaluate)."""
    model.eval()
    lpips = getattr(model, "perceptual", None)  # (--eval-only builds none: no weights needed to evaluate)
    keys = RECONSTRUCTION + (("lpips",) if lpips is not None else ())
    sums, count = torch.zeros(len(keys), device=device, dtype=torch.float64), 0
    if rfid is not None:
        rfid.reset()
    for x, _ in eval_batches(loader, device):
        if stop:
            model.train()
            return None
        with amp_ctx:
            x_hat, mean, logvar = model.reconstruct(x)
            m = loopvae.reconstruction_metrics(x, x_hat, mean, logvar)
        if rfid is not None:  # images in [0, 1] (normalize=True)
            rfid.update(loopvae.to_unit(x), real=True)
            rfid.update(loopvae.to_unit(x_hat).clamp(0, 1), real=False)
        if lpips is not None:  # the network's mean over the batch, as a sum
            m["lpips"] = lpips(x_hat.float(), x.float()) * len(x)
        sums += torch.stack([m[k].double().sum() for k in keys])
        count += len(x)
    model.train()
    *totals, n = summed_over_ranks(sums, count)
    out = {f"val_{k}": v / n for k, v in zip(keys, totals)}
    if rfid is not None:  # (torchmetrics gathers the features of every rank)
        out["val_rfid"] = float(rfid.compute())
    return out


def reconstruction_report(args, run, raw_model, ema, val_loader, step, rfid=None):
    """--eval-only of a tokenizer: its validation metrics (evaluate_reconstruction; the EMA weights with
    --eval-ema) printed as one line and written to OUT/reconstruction_eval.json, or reconstruction_eval-2.json (the
    next free number) where OUT holds one (results_files) (`run`: the run's Run, its device, precision and stop;
    `step`: the checkpoint's). Raises Preempted for a stop request (one process:
    after the batch in flight)."""
    device, amp_ctx, master, stop = run.device, run.amp_ctx, run.master, run.stop
    weights, model = ("ema", ema.module) if args.eval_ema else ("model", raw_model)
    r = evaluate_reconstruction(model, val_loader, device, amp_ctx, None if dist.is_initialized() else stop, rfid)
    if r is None:
        raise Preempted(stop.line("in the evaluation"))
    if not master:
        return
    print(f"{args.resume} (step {step}, {weights} weights): validation PSNR {r['val_psnr']:.2f} dB (unclipped "
          f"{r['val_psnr_raw']:.2f}), SSIM {r['val_ssim']:.4f}, L1 {r['val_l1']:.4f}, KL {r['val_kl']:.4g}, "
          f"out-of-range pixels {100 * r['val_out_of_range']:.2f} %" + (f", rFID {r['val_rfid']:.3f}" if rfid else ""))
    res = {"checkpoint": args.resume, "eval_only": True, "model": args.model, "step": step, "weights": weights,
           "val_subset": args.val_subset, "img_size": args.img_size or raw_model.img_size, **r}
    path, = results_files(args, master, "reconstruction_eval.json")  # (never replaces a record it did not make)
    write(path, json.dumps(res, indent=1), stop.kept())


def epoch_line(epoch, rec, step, total_steps):
    """The line printed after an epoch's evaluation (`rec`: its log.jsonl record): PSNR, SSIM, L1 (LPIPS,
    rFID when measured), and its non-finite steps (training/monitor.py's epoch_line)."""
    said = f"PSNR {rec['val_psnr']:.2f} dB, SSIM {rec['val_ssim']:.4f}, L1 {rec['val_l1']:.4f}" + (
        f", LPIPS {rec['val_lpips']:.4f}" if "val_lpips" in rec else "") + (
        f", rFID {rec['val_rfid']:.3f}" if "val_rfid" in rec else "")
    return classifier_line(epoch, rec, step, total_steps, said)
