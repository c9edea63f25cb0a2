"""Device plumbing for rvits: how train.py, bench.py and analyze.py compile a model and end a
compiled process. Model files never import it (each has its own `compile_regions()`).

1. `choose_scope`, `compile_for_training`: which torch.compile serves the training forward.
   - "blocks" (regional compilation): each distinct block compiled once (`model.compile_regions()`),
     the depth loop, embedding, head and loss eager. Compile time does not grow with depth and a new
     depth needs no recompilation, but every step launches each block's kernels from Python: a
     small model (CIFAR, D=192, 65 tokens) is then bound by the host, not the GPU (the first H200
     run: bViT-Ti/4 at batch 512 trained at ~31 TFLOP/s, 3 % of the bf16 peak).
   - "model": the whole training forward at the trained depth (embedding, every step, head, loss)
     is one compiled graph, and its backward another; on CUDA with mode="reduce-overhead", so both
     replay as CUDA graphs (one launch each instead of hundreds). On a torch where it was checked
     (NESTED_REGIONS_TORCH) each step in it is a nested compile region (the model files' `apply_step`,
     torch.compiler.nested_compile_region), compiled with inductor's buffer reuse off: traced and
     compiled once and called at every step, not unrolled (bench.py's *_model_compile_d48_over_d12);
     elsewhere the steps are unrolled as before issue 66. The blocks
     are also compiled regionally, for evaluation at any depth without recompilation. Only for models whose
     training forward has the same operations and shapes every step (`model.trains_as_one_graph()`;
     not reViT's elastic depth, whose step sizes are data), and where the caller allows it
     (train.py: one process, no --teacher; under DDP the blocks path).
   - "auto": "model" where it applies, else "blocks".
   `compiler_missing`: whether this machine has the compiler torch.compile builds its kernels with,
   asked before a run starts (inductor's own search for a C++ compiler on the CPU, Triton's for a C
   compiler on CUDA; a machine without one failed at the first step).
2. `release_compile_workers`: a bounded shutdown of inductor's compile-worker pool. Found on the
   first H200 run (torch 2.11): every process whose first `torch.compile` started the pool
   finished its work and then never exited, its main thread waiting in inductor's
   `shutdown_compile_workers` -> `SubprocPool.shutdown` -> `subprocess.wait` (public reports:
   pytorch#162199, pytorch#183884). torch 2.14 bounds that wait at 300 s (and kills the sidecar);
   torch 2.11 waits 300 s and then raises. We run torch's own exit handler,
   `torch._inductor.async_compile.shutdown_compile_workers` (the function it registers with atexit),
   in a thread, bound it at a few seconds, and then kill the pool's sidecar, found by what the OS
   shows: the child process whose command line carries `--parent=<our pid>` (inductor starts its
   sidecar so); the handler then returns, and torch's own atexit call finds no pool. No private
   attribute is read (up to commit 6162896 it read four: the pool set, `SubprocPool.process`, ...).
   torch 2.14.1's sources have both (tests/test_speed.py starts its real pool and ends it); on the
   GPU machine's torch `inductor_names`, printed first in a window, says whether they are there.
"""
import os
import signal
import sys
import threading

import torch

SCOPES = ("auto", "blocks", "model")


def choose_scope(model, scope="auto", blockers=()):
    """The compile scope `scope` (one of SCOPES) resolves to for `model`: ("model" or "blocks", why not
    "model" or None). blockers: the caller's reasons why the training forward cannot be one graph
    (train.py: DDP, --teacher, --eval-only). Raises ValueError for "model" where a blocker, or the
    model itself (`trains_as_one_graph()`), rules it out. Compiles nothing."""
    if scope not in SCOPES:
        raise ValueError(f"compile scope {scope!r}; allowed: {', '.join(SCOPES)}")
    blockers = list(blockers)
    if not getattr(model, "trains_as_one_graph", lambda: False)():
        blockers.append(f"{type(model).__name__}'s training forward changes shape from step to step")
    if scope == "model" and blockers:
        raise ValueError(f"scope 'model' is not available here ({'; '.join(blockers)}); use blocks or auto")
    if scope == "blocks":
        return "blocks", "asked for"
    return ("blocks", "; ".join(blockers)) if blockers else ("model", None)


def compile_for_training(model, scope, device=None, mode=None):
    """Compile `model` (before DDP) for training in `scope` ("blocks" or "model", from choose_scope);
    returns the module the training step calls. The blocks are always compiled regionally
    (evaluation and DDP use them); "model" returns torch.compile(model, mode=mode), sharing the
    model's parameters; mode None means "reduce-overhead" on CUDA (CUDA graphs) and the default
    elsewhere ("max-autotune" also replays CUDA graphs, and autotunes each matmul first: a speed
    variant of scripts/gpu_check.py)."""
    model.compile_regions() if hasattr(model, "compile_regions") else model.compile()
    if scope == "blocks":
        return model
    cuda = device is not None and torch.device(device).type == "cuda"
    mode = mode or ("reduce-overhead" if cuda else None)
    if not nested_regions_checked() or not hasattr(model, "nested_regions"):
        return torch.compile(model, mode=mode)  # each step unrolled in the graph
    model.nested_regions = True  # each step a nested compile region (the model file's apply_step)
    options = {**(torch._inductor.list_mode_options(mode) if mode else {}), "allow_buffer_reuse": False}
    return torch.compile(model, options=options)


# torch versions (major, minor) whose inductor gives a whole-model graph with nested compile regions the
# gradients of eager code, with its buffer reuse off (torch 2.14.1 on the CPU: tests/test_speed.py's
# whole-model test). With buffer reuse on, 2.14.1 reuses a buffer across the region's calls: wrong
# gradients (bViT, depth 2: 84 off in attn.proj.bias). Not checked: 2.11 (the GPU machine's; its probe of
# 2026-12-04 compared the loss only), so there the steps stay unrolled.
NESTED_REGIONS_TORCH = {(2, 14)}


def nested_regions_checked(version=None):
    """Whether compile_for_training marks each step as a nested compile region on this torch (`version`,
    default torch.__version__): its (major, minor) in NESTED_REGIONS_TORCH and the API present."""
    major, minor = (int(v) for v in (version or torch.__version__).split(".")[:2])
    return (major, minor) in NESTED_REGIONS_TORCH and hasattr(torch.compiler, "nested_compile_region")


def compiler_missing(device):
    """Why torch.compile could not build kernels for `device` on this machine, in words, or None: the C++
    compiler inductor's CPU kernels need, found by inductor's own search (config.cpp.cxx, $CXX), or the
    C compiler Triton builds its CUDA launchers with (its search: $CC, gcc, clang). A torch or Triton
    without that search (private names) is not checked: None. Compiles nothing."""
    cuda = torch.device(device).type == "cuda"
    try:
        if cuda:
            from triton.runtime.build import _find_compiler
            _find_compiler("c")
        else:
            from torch._inductor.cpp_builder import get_cpp_compiler
            get_cpp_compiler()
    except (ImportError, AttributeError):
        return None
    except Exception as e:  # (inductor: InvalidCxxCompiler, a RuntimeError; Triton: RuntimeError)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200].rstrip(".")
        what = "C compiler (for Triton's CUDA kernels)" if cuda else "C++ compiler (for its CPU kernels)"
        fix = "gcc, or set CC to one" if cuda else "g++, or set CXX to one"
        return f"torch.compile finds no {what}: {why}; install one ({fix}), or leave out --compile"
    return None


def inductor_names():
    """{what `release_compile_workers` relies on: present in this torch} (module docstring, item 2):
    inductor's exit handler `async_compile.shutdown_compile_workers`, and its compile-worker sidecar
    started with `--parent=<pid>` on its command line (read in SubprocPool's source). Printed first in
    a GPU window (scripts/gpu_run.py), tested on the CPU; {} without inductor."""
    try:
        from torch._inductor import async_compile
        from torch._inductor.compile_worker import subproc_pool
    except ImportError:
        return {}
    pool = getattr(subproc_pool, "SubprocPool", None)
    return {"async_compile.shutdown_compile_workers": callable(getattr(async_compile, "shutdown_compile_workers", None)),
            "sidecar --parent=<pid>": pool is not None and "--parent=" in _source(pool.__init__)}


def _source(fn):
    import inspect
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def compile_worker_sidecars():
    """Process ids of this process's children that are inductor compile-worker sidecars: a command line
    (Linux /proc) with `--parent=<this pid>`. [] where /proc is not there."""
    me, found = os.getpid(), []
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # (gone meanwhile, or not ours to read)
        if f"--parent={me}" in argv:
            found.append(pid)
    return found


def release_compile_workers(timeout=3.0):
    """Shut down inductor's compile-worker pools with torch's own exit handler, waiting at most `timeout`
    seconds before killing their sidecar processes (module docstring, item 2). Safe to call when
    nothing was compiled (inductor not even imported: nothing to do), and more than once; the atexit
    and multiprocessing finalizers that would shut the pools down again then find nothing to do.
    Returns the number of sidecar processes that had to be killed."""
    if "torch._inductor.async_compile" not in sys.modules:  # no compile started a pool in this process
        return 0
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:
        return 0
    done = threading.Event()

    def shutdown():
        try:
            shutdown_compile_workers()
        except Exception:  # (torch 2.11 raises after its own 300 s wait; a pool that fails is killed below)
            pass
        finally:
            done.set()

    threading.Thread(target=shutdown, name="release_compile_workers", daemon=True).start()
    if done.wait(timeout):
        return 0
    sidecars = compile_worker_sidecars()
    for pid in sidecars:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # (it exited meanwhile)
            pass
    done.wait(timeout)  # the handler returns once its wait() sees the sidecar gone
    return len(sidecars)
