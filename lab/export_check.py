"""The S/16 classifiers at 224 px, untrained, through export.py: export_fixed and export_loop, the
seconds each export takes and the largest |logit difference| against the eager model on 2 images (fixed: at
the trained depth; loop: one export, run at depths 6, 12 and 24). docs/models.md "Export" quotes its output.

    python lab/export_check.py       # a few minutes on a 2-core CPU; prints one line per model
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import bvit  # noqa: E402
import export  # noqa: E402
import odevit  # noqa: E402
import revit  # noqa: E402
import srvit  # noqa: E402
from provenance import commit, cpu_model  # noqa: E402


@torch.no_grad()
def worst(a, b):
    return (a - b).abs().max().item()


def main():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 224, 224)
    print(f"commit {commit()}, {cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, build in [("bvit_s", bvit.bvit_s), ("revit_s E=4", lambda: revit.revit_s(experts=4)),
                        ("srvit_s R=2", lambda: srvit.srvit_s(recursions=2)), ("odevit_s", odevit.odevit_s)]:
        m = build().eval()
        if isinstance(m, revit.ReViT):  # gates that differ between steps (the router's output starts at zero)
            with torch.no_grad():
                for p in m.router.parameters():
                    p.normal_(0, 0.5)
        t = time.time()
        fixed = export.export_fixed(m).module()
        line = f"{name}: export_fixed {time.time() - t:.1f} s, max |diff| {worst(fixed(x), m(x)):.1e}"
        t = time.time()
        loop = export.export_loop(m).module()
        took = time.time() - t
        diffs = "/".join(f"{worst(loop(x, torch.tensor(d)), m(x, depth=d)):.1e}" for d in (6, 12, 24))
        print(f"{line}; export_loop {took:.1f} s, max |diff| at depths 6/12/24: {diffs}", flush=True)


if __name__ == "__main__":
    main()
