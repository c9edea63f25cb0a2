"""Does LoopVAE use its loops? The loop interventions of LoopVAE (arXiv 2609.11516, sec. 4.4) on a
tokenizer checkpoint (analyze.py of a LoopVAE checkpoint: loops.json).

Every stage with more than one pass is truncated to its first k passes (the rest of the model in full:
"completing the schedule" should never lower the PSNR), and every pass of every stage, single-pass ones
included (the paper's 14 bypasses per image), is bypassed (its output replaced by its input), beside the
relative update of each pass (eq. 12): small updates that matter. Truncation is not early exit: the
out-of-range fraction of the pixels after k passes is kept beside the PSNR, clipped and unclipped (Table 7
reports both), and every number per image, so that every verdict can be recomputed per image.
"""
import torch


@torch.no_grad()
def loop_interventions(model, images, batch_size=128):
    """The loop interventions of LoopVAE (arXiv 2609.11516, sec. 4.4) on `images` (N, 3, H, W) in
    [-1, 1], in eval mode (posterior mode), for every stage with more than one pass. Returns a dict:
      full: mean psnr (dB), ssim and out_of_range (fraction of pixels) of the full schedule;
      prefix: {stage: [mean PSNR with the first k passes, k = 1..L_s]} (the rest of the model in full;
        k = L_s is the full schedule), monotone: {stage: fraction of images whose PSNR never drops as k
        grows} (the paper: 1.0, "completing the schedule"), prefix_out_of_range: {stage: [mean
        out-of-range fraction after k passes]} (truncation is not early exit);
      prefix_psnr_raw: {stage: [mean unclipped PSNR after k passes]} (Table 7 reports both);
      bypass: {stage: [PSNR lost when pass t's output is replaced by its input, t = 0..L_s-1]}, for
        every stage, single-pass ones included (the paper's 14 bypasses per image),
        most_sensitive: {stage: the pass t losing most}, update: {stage: [mean relative update
        RMS(h_{t+1} - h_t) / RMS(h_t) of pass t]} (eq. 12; small updates that matter);
      per_image: the same per image, so that every verdict can be recomputed per image: full {psnr,
        psnr_raw, ssim, out_of_range: [N]}, prefix {stage: {psnr, psnr_raw, ssim, out_of_range:
        [k][N]}}, bypass {stage: [t][N] PSNR lost}, update {stage: [t][N]}."""
    model.eval()
    schedule = model.schedule()
    multi = {name: n for name, n in schedule.items() if n > 1}
    per = ("psnr", "psnr_raw", "ssim", "out_of_range")
    as_list = lambda t: [round(float(v), 5) for v in t]

    def run(**kw):  # per-image metrics over all images, and the traces of the full schedule
        out, trace = {}, {} if not kw else None
        for i in range(0, len(images), batch_size):
            m = model.metrics(images[i:i + batch_size], trace=trace if trace is not None else None, **kw)
            for k, v in m.items():
                out.setdefault(k, []).append(v)
            if trace is not None:
                for name, r in trace.items():
                    out.setdefault("trace:" + name, []).append(r)
                trace.clear()
        return {k: torch.cat(v) for k, v in out.items()}
    full = run()
    res = {"stages": multi, "num_images": len(images),
           "full": {k: float(full[k].mean()) for k in ("psnr", "ssim", "out_of_range")},
           "prefix": {}, "monotone": {}, "prefix_out_of_range": {}, "prefix_psnr_raw": {}, "bypass": {},
           "most_sensitive": {}, "update": {},
           "per_image": {"full": {k: as_list(full[k]) for k in per}, "prefix": {}, "bypass": {}, "update": {}}}
    for name, passes in multi.items():
        runs = [run(truncate={name: k}) for k in range(1, passes)] + [full]
        psnrs = torch.stack([r["psnr"] for r in runs], 1)  # (N, passes)
        res["prefix"][name] = [float(v) for v in psnrs.mean(0)]
        res["monotone"][name] = float((psnrs.diff(dim=1) >= -1e-4).all(1).float().mean())
        res["prefix_out_of_range"][name] = [float(r["out_of_range"].mean()) for r in runs]
        res["prefix_psnr_raw"][name] = [float(r["psnr_raw"].mean()) for r in runs]
        res["per_image"]["prefix"][name] = {k: [as_list(r[k]) for r in runs] for k in per}
    for name, passes in schedule.items():  # every stage's bypasses, single-pass stages included
        lost = [full["psnr"] - run(bypass=(name, t))["psnr"] for t in range(passes)]  # (N,) each
        res["bypass"][name] = [float(v.mean()) for v in lost]
        res["most_sensitive"][name] = max(range(passes), key=res["bypass"][name].__getitem__)
        res["per_image"]["bypass"][name] = [as_list(v) for v in lost]
        if name in multi:
            res["update"][name] = [float(v) for v in full["trace:" + name].mean(0)]
            res["per_image"]["update"][name] = [as_list(v) for v in full["trace:" + name].T]
    return res
