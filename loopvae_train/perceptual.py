"""The optional perceptual networks of a tokenizer run: LPIPS as a loss term (--perceptual lpips) and the
FID Inception network as a metric (--rfid). Both come from maintained packages that requirements.txt
does not list (lpips; torchmetrics with torch-fidelity), with weights that are checked or cached; when a
package or its weights cannot be had, one line says how to get them (Fail), never a network with random
weights.
"""
import os
import warnings

import torch

from training.weights import read_weights
from training.exits import Fail

# LPIPS's backbone (lpips_loss): torchvision's ImageNet VGG16, file name = torchvision's cache name, whose
# 8 hex digits start its SHA-256 (torchvision checks them on download; lpips_loss on a given file).
VGG16_FILE, VGG16_SHA256 = "vgg16-397923af.pth", "397923af"
VGG16_URL = "https://download.pytorch.org/models/" + VGG16_FILE


def lpips_loss(weights_file=None):
    """--perceptual lpips: LPIPS (Zhang et al. 2018) from the maintained `lpips` package, an optional
    extra: VGG16 backbone (our choice, as the LDM autoencoders train with; the LoopVAE paper does not
    name it) with the package's own calibrated linear layers, frozen, in eval mode. The backbone's
    ImageNet weights come from `weights_file` (--lpips-weights, checked against VGG16_FILE's SHA-256
    prefix), else torchvision's cache (TORCH_HOME), else a download by torchvision. Returns
    fn(x_hat, x) -> 0-d mean LPIPS of images (B, 3, H, W) in [-1, 1], which moves the network to the
    images' device. Raises Fail (one line) when the package or the weights cannot be had: never a
    network with random weights."""
    try:
        import lpips
    except ImportError as e:
        if e.name and e.name.split(".")[0] != "lpips":  # lpips is there; a package it imports is not (scipy)
            raise Fail(f"--perceptual lpips: the lpips package needs {e.name}, which is not installed: pip install "
                       f"{e.name.split('.')[0]} (or train with --perceptual none)")
        raise Fail("--perceptual lpips needs the lpips package, an optional extra not in requirements.txt: "
                   "pip install lpips (or train with --perceptual none)")
    except Exception as e:  # noqa: BLE001 (a package too old or broken: an import can raise anything)
        raise Fail(f"--perceptual lpips: the lpips package cannot be imported ({type(e).__name__}: "
                   f"{(str(e).strip().splitlines() or [''])[0][:160]}): pip install -U lpips (or train with --perceptual none)")
    import hashlib
    import torchvision
    cache = os.path.join(torch.hub.get_dir(), "checkpoints")
    how = (f"download {VGG16_URL} on a connected machine, then pass --lpips-weights FILE or put the file in "
           f"{cache} (torchvision's cache, $TORCH_HOME/hub/checkpoints)")
    path = weights_file or os.path.join(cache, VGG16_FILE)
    what = "--lpips-weights" if weights_file else "LPIPS's VGG16 weights in torchvision's cache,"  # who named the file
    if weights_file is None and not os.path.isfile(path):
        try:
            with warnings.catch_warnings():  # as below
                warnings.simplefilter("ignore", UserWarning)
                net = lpips.LPIPS(net="vgg", verbose=False)  # torchvision downloads the backbone into the cache
        except OSError as e:  # no network (urllib's URLError), a full disk, ...
            raise Fail(f"--perceptual lpips: LPIPS's VGG16 ImageNet weights are not in {cache} and could not be "
                       f"downloaded ({getattr(e, 'reason', None) or e}); {how}")
    else:
        try:
            weights = read_weights(path, what)
        except Fail as e:
            raise Fail(f"{e}; {how}")
        vgg = torchvision.models.vgg16()  # the architecture only: no weights, no download
        try:
            vgg.load_state_dict(weights)
        except (RuntimeError, AttributeError, TypeError) as e:
            raise Fail(f"{what} {path}: not torchvision's VGG16 weights ({type(e).__name__}); {how}")
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if not digest.startswith(VGG16_SHA256):
            raise Fail(f"{what} {path}: VGG16 weights, but not torchvision's ImageNet ones (SHA-256 "
                       f"{digest[:8]}..., expected {VGG16_SHA256}...); {how}")
        with warnings.catch_warnings():  # torchvision's notice that lpips uses its old `pretrained` argument
            warnings.simplefilter("ignore", UserWarning)
            net = lpips.LPIPS(net="vgg", pnet_rand=True, verbose=False)  # no download; given the weights below
        features = vgg.features.state_dict()  # lpips' slice k holds features[i] under the name "slicek.i"
        net.net.load_state_dict({k: features[k.split(".", 1)[1]] for k in net.net.state_dict()})
    net.eval().requires_grad_(False)

    def perceptual(x_hat, x):
        if next(net.parameters()).device != x.device:
            net.to(x.device)
        return net(x_hat, x).mean()  # lpips takes images in [-1, 1]
    return perceptual


def rfid_metric(device):
    """--rfid: torchmetrics' FrechetInceptionDistance (2048-d pool features of the FID Inception network,
    images in [0, 1]) on `device`, an optional extra; its weights come from torch-fidelity's cache
    ($TORCH_HOME/hub/checkpoints), else a download. Raises Fail (one line) when the package or the
    weights cannot be had: never an Inception network with random weights."""
    how = ("on a connected machine, pip install 'torchmetrics[image]' and run once with --rfid (torch-fidelity "
           f"caches the weights in {os.path.join(torch.hub.get_dir(), 'checkpoints')}), or train without --rfid")
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
        fid = FrechetInceptionDistance(feature=2048, normalize=True)
    except ImportError as e:  # torchmetrics, or its torch-fidelity
        raise Fail(f"--rfid needs torchmetrics with torch-fidelity, an optional extra not in requirements.txt "
                   f"({e.name or e}); {how}")
    except OSError as e:  # no network (urllib's URLError), a full disk, ...
        raise Fail(f"--rfid: the FID Inception weights are not cached and could not be downloaded "
                   f"({getattr(e, 'reason', None) or e}); {how}")
    except Exception as e:  # noqa: BLE001 (a package too old or broken: an import can raise anything)
        raise Fail(f"--rfid: torchmetrics' FrechetInceptionDistance cannot be used ({type(e).__name__}: "
                   f"{(str(e).strip().splitlines() or [''])[0][:160]}); {how}")
    return fid.to(device)
