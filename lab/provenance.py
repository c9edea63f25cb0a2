"""Where a result was measured: the commit and the CPU model that lab/reproduce_mini.sh writes into each
run's done.json, lab/gpu_study.py into its result lines and lab/check_readme.py into README's
provenance lines."""
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit():
    """The commit results are stamped with: $COMMIT (the GPU machine gets no .git), else git's short
    HEAD, with "+changes" when tracked files differ from it; "unknown" without git."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "") if head.returncode == 0 else "unknown"


def commit_date(rev=None):
    """The UTC date and time ("YYYY-MM-DD HH:MM") of commit `rev` (default: HEAD): when the code a result ran
    was committed (lab/claims.py compares it with a claim's registration); "unknown" without git."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M",
                              (rev or "HEAD").split("+")[0]], capture_output=True, text=True, cwd=ROOT,
                             env=dict(os.environ, TZ="UTC"))
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's; '?' if neither says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
