"""The house the README promises (issue 36): train.py a tutorial whose step a reader meets early, the
machinery in training/, the tests in tests/, and tools that do not import the tutorial."""
import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def source(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def calls(tree):
    """(line, the called name: `f` of f(...) or of obj.f(...)) of every call under `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            yield node.lineno, fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)


def test_train_py_is_a_tutorial_whose_step_comes_before_line_200():
    """At most 450 lines, no flag defined in it, main() at most ~100 lines, and in train() the forward
    (`model(x, y)`), the backward and the optimizer step all stand before line 200."""
    text = source("train.py")
    tree = ast.parse(text)
    assert len(text.splitlines()) <= 450
    assert "add_argument" not in text, "flags are defined in training/flags.py"
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    main, loop = defs["main"], defs["train"]
    assert main.end_lineno - main.lineno + 1 <= 100
    assert main.lineno < loop.lineno, "main() is the table of contents: it comes first"
    seen = {}
    for line, name in sorted(calls(loop)):
        seen.setdefault(name, line)
    assert seen["model"] < 200, "the forward"
    assert seen["backward"] < 200, "the backward"
    assert seen["optimizer_step"] < 200, "the optimizer step"
    assert seen["model"] < seen["backward"] < seen["optimizer_step"]


def test_the_parser_describes_train_py_with_its_docstring():
    import train
    from training import flags
    assert flags.get_parser().description == train.__doc__.split("\n")[0]


def imports_of(path):
    """The modules the file `path` imports, at the top or inside a function (their full dotted names)."""
    found = set()
    for node in ast.walk(ast.parse(source(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_train_py_and_training_never_import_loopvae():
    """Issue 78, item 4: LoopVAE trains through its own entry point (train_loopvae.py, loopvae_train/); train.py
    and every file of training/ import neither the model nor its training."""
    paths = ["train.py", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "training", "*.py")))]
    assert len(paths) > 10
    for path in paths:
        bad = {m for m in imports_of(path) if m.split(".")[0] in ("loopvae", "loopvae_train", "train_loopvae")}
        assert not bad, f"{path} imports {sorted(bad)}"
    assert "loopvae" in imports_of("train_loopvae.py") | imports_of("loopvae_train/flags.py")  # (the walk sees one)


def test_train_py_help_has_no_loopvae_flag():
    """Issue 78, item 4: LoopVAE's flags (its model and Stage-2 groups, --rfid) leave train.py --help; they are
    train_loopvae.py's, whose parser has every flag of a run beside them (data, optimization, checkpoints)."""
    from loopvae_train import flags as lvflags
    from training import flags
    mine = {a.dest for a in flags.get_parser()._actions}
    lv = lvflags.get_parser()
    own = {a.dest for g in lv._action_groups if g.title.startswith("model: LoopVAE") for a in g._group_actions}
    assert len(own) == 19 and {"loops", "stage2", "rfid", "disc", "kl_weight"} <= own
    assert not own & mine, sorted(own & mine)
    text = flags.get_parser().format_help()
    assert not re.search(r"loopvae|LoopVAE|--stage2|tokenizer", text), re.findall(r".*(?:loopvae|LoopVAE|stage2).*", text)
    assert {"data", "lr", "resume", "save_every", "log_every", "max_steps", "ema"} <= {a.dest for a in lv._actions}
    assert len(mine) - 1 <= 85  # (--help itself not counted; 105 before the move)
    moved = {a.dest: flags.parsed_default(a, a.default) for a in lv._actions if a.dest in own}
    assert flags.MOVED_FLAGS == moved  # (an older args.json of train.py holds them at these values: --config)


def test_train_loopvae_py_is_a_short_tutorial_of_its_own_loop():
    """train_loopvae.py: its docstring is its parser's description, no flag defined in it, and in train() the
    forward, the adversarial term, the backward and the optimizer step in that order, before line 200."""
    import train_loopvae
    from loopvae_train import flags as lvflags
    text = source("train_loopvae.py")
    assert "add_argument" not in text and len(text.splitlines()) <= 250
    assert lvflags.get_parser().description == train_loopvae.__doc__.split("\n")[0]
    loop = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "train")
    seen = {}
    for line, name in sorted(calls(loop)):
        seen.setdefault(name, line)
    assert seen["model"] < seen["adversary"] < seen["backward"] < seen["optimizer_step"] < 200


def test_tests_live_in_tests_beside_the_models_own():
    top = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "test_*.py")))
    assert top == ["test_models.py"], "tests other than the models' own go in tests/"
    assert not os.path.exists(os.path.join(ROOT, "conftest.py"))


def imports(path):
    """Every module name the file at `path` imports, at the top or inside a function (a.b of `from a.b import c`)."""
    found = set()
    for node in ast.walk(ast.parse(source(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", ["bench.py", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "scripts", "*.py")))])
def test_tools_import_training_not_the_tutorial(path):
    """The tools reach the flags and the registry in training/, never by importing train.py (a
    subprocess running train.py is fine); the lab's tools are held to the same (lab/tests/test_lab_house.py)."""
    assert "train" not in imports(path), path


def product_files():
    """Every .py file of the product: the top level, training/, scripts/, tests/ (everything but lab/)."""
    return sorted(os.path.relpath(p, ROOT) for d in ("", "training", "scripts", "tests")
                  for p in glob.glob(os.path.join(ROOT, d, "*.py")))


def lab_names():
    """The names a file would import the lab by: lab itself, its modules and packages (claims, analyze, probe,
    analysis, summarize_mini, ...: lab/ is on the lab's path), its tests, and the folders it replaced (studies)."""
    lab = os.path.join(ROOT, "lab")
    names = {"lab", "studies", "analysis"}
    for d in (lab, os.path.join(lab, "tests")):
        names |= {os.path.splitext(n)[0] for n in os.listdir(d) if n.endswith(".py")}
        names |= {n for n in os.listdir(d) if os.path.isfile(os.path.join(d, n, "__init__.py"))}
    return names


def test_the_product_never_imports_the_lab():
    """Issue 78: two houses on one lot. The product (the models, train.py, training/, data.py, bench.py, scripts/,
    the product's tests) never imports the lab (lab/: studies, claims, analyses, kept runs), at the top of a file or
    inside a function; the lab drives the product from outside and may import it."""
    names = lab_names()
    assert {"claims", "analyze", "probe", "analysis", "summarize_mini", "test_claims"} <= names
    files = product_files()
    assert {"train.py", "bvit.py", "training/flags.py", "scripts/gpu_run.py", "tests/test_house.py"} <= set(files)
    found = [f"{p} imports {m}" for p in files for m in sorted(imports(p)) if m.split(".")[0] in names]
    assert not found, found


def test_training_package_is_a_docstring_naming_each_module_in_reading_order():
    """training/__init__.py (and lab/analysis/__init__.py: lab/tests/test_lab_house.py) is a docstring with one
    line per module."""
    check_package_docstring("training")


def check_package_docstring(package):
    """The package at `package` (a folder under the repository) has an __init__.py that is a docstring naming
    each of its modules once."""
    init = ast.parse(source(os.path.join(package, "__init__.py")))
    assert len(init.body) == 1 and isinstance(init.body[0].value, ast.Constant)
    doc = ast.get_docstring(init)
    modules = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, package, "*.py")))
    listed = re.findall(r"^\s*(\w+\.py)\s", doc, re.M)  # one line per module: "    flags.py   which flags ..."
    assert sorted(listed) == [m for m in modules if m != "__init__.py"], f"{package}/__init__.py: each module once"


def test_training_holds_only_what_train_py_leans_on():
    """Every module in training/ is imported by train.py, directly or through another training module
    (imports at the top or inside a function); what only analyze.py or probe.py use lives in lab/analysis/."""
    def training_imports(path):
        found = set()
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("training.")}
            elif isinstance(node, ast.ImportFrom) and node.module == "training":
                found |= {a.name for a in node.names}  # from training import flags, registry
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("training."):
                found.add(node.module.split(".")[1])  # from training.monitor import Fail
        return found
    modules = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "training", "*.py"))}
    reached, todo = set(), training_imports("train.py")
    while todo:
        name = todo.pop()
        if name in modules and name not in reached:
            reached.add(name)
            todo |= training_imports(os.path.join("training", name + ".py"))
    assert sorted(modules - reached - {"__init__"}) == [], "training/ modules that train.py never imports"


def test_model_files_import_only_torch():
    """Each model file can be copied alone into another project: it imports torch and the standard
    library, nothing of rvits."""
    own = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "*.py"))} | {"training"}
    for path in ("bvit.py", "revit.py", "srvit.py", "odevit.py", "loopvae.py"):
        for node in ast.walk(ast.parse(source(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                assert name.split(".")[0] not in own, f"{path} imports {name}"


def project_imports():
    """{module: the project modules it imports, at the top of the file or inside a function}, for every .py
    file git would track here: top-level files and packages by their dotted path (training.flags), the
    scripts, the tests and the lab's tools by their name (each puts its folder on sys.path), lab/analysis as
    analysis."""
    paths = [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)]
    paths = [p for p in paths if not p.startswith(("results", "lab/results", "runs", ".")) and "site-packages" not in p]
    name = {p: (os.path.splitext(os.path.basename(p))[0] if p.startswith(("scripts", "tests", "lab/tests")) or
                os.path.dirname(p) == "lab" else
                os.path.splitext(p.removeprefix("lab" + os.sep))[0].replace(os.sep, ".").removesuffix(".__init__"))
            for p in paths}
    known = set(name.values())
    graph = {}
    for path, module in name.items():
        out = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            for t in targets:  # the longest known prefix: training.flags, not training
                parts = t.split(".")
                hit = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known), None)
                if hit and hit != module and not (hit == "training" and t != "training"):
                    out.add(hit)
    return graph


def cycle(graph):
    """One import cycle of `graph` as a list of modules (its first one again at the end), or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_import_cycle_among_the_project_modules():
    """Each module reads with what it imports read before it: no chain of imports, top-level or inside a
    function, leads from a project module back to itself (e.g. registry.py -> adversarial.py -> registry.py)."""
    graph = project_imports()
    assert {"train", "training.flags", "training.registry", "bvit"} <= set(graph)
    assert "training.checkpoints" in graph["training.flags"] or "training.weights" in graph["training.flags"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"] and cycle({"a": {"b"}}) is None
    found = cycle(graph)
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_run_facts_travel_as_one_record():
    """main() builds one Run (training/run.py: processes, device, precision, stop, paths, length, start)
    and passes it, instead of 7-tuples and 13-15 parameter lists: runtime returns a Run, and no function of
    train.py or training/ takes more than the 13 of train(), the loop (its model, optimizer and loaders)."""
    import train
    from training import exits, flags, run
    p = flags.get_parser()
    r = train.runtime(p.parse_args(["--device", "cpu"]), p, exits.Stop())
    assert isinstance(r, run.Run) and (r.ddp, r.rank, r.world, r.master, r.micro) == (False, 0, 1, True, 128)
    for path in ["train.py", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "training", "*.py")))]:
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, ast.FunctionDef):
                n = len(node.args.args) + len(node.args.kwonlyargs)
                assert n <= 13, f"{path}: {node.name}() takes {n} parameters"


# A file the docs name by its path: scripts/, lab/, training/, ... up to its extension, not inside a longer name.
NAMED_PATH = re.compile(r"(?<![\w/.+-])((?:lab|scripts|studies|training|analysis|tests|docs|results)/[\w.+-]+(?:/[\w.+-]+)*"
                        r"\.(?:py|sh|md|png|jsonl?))(?![\w.])")


def named_paths(text):
    """The repository paths `text` names (scripts/NAME.py, docs/NAME.md, ...)."""
    return NAMED_PATH.findall(text)


def test_named_paths_finds_paths_and_leaves_other_names():
    text = "run `bash lab/reproduce_mini.sh`, see lab/docs/results.md and lab/results/gpu/results.jsonl; x/scripts/a.py no"
    assert named_paths(text) == ["lab/reproduce_mini.sh", "lab/docs/results.md", "lab/results/gpu/results.jsonl"]


# Files the docs name that a study writes when it first runs, and the code that writes them.
WRITTEN_LATER = {"lab/results/gpu/concurrency.jsonl": "lab/summarize_gpu.py"}


def test_every_path_the_docs_name_exists():
    """README and docs/ name files a reader runs or opens: each exists (a file moved by a refactor leaves no
    stale command behind). The lab's pages: lab/tests/test_lab_house.py."""
    stale = stale_paths(["README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))])
    assert not stale, stale


def results_names():
    """The records a run writes through training/evaluation.py results_files (grepped from the product's calls):
    --eval-only never takes one's name where OUT holds it, and writes NAME-2.json, the next free number, instead."""
    found = set()
    for path in ["train.py", "train_loopvae.py", *glob.glob(os.path.join(ROOT, "training", "*.py")),
                 *glob.glob(os.path.join(ROOT, "loopvae_train", "*.py"))]:
        found |= set(re.findall(r'results_files\(args, master, "(\w+)\.json"', source(path)))
    return found


def eval_only_claims(texts, names):
    """The sentences of `texts` ({where: text}) that say --eval-only writes NAME.json (a name of `names`) without
    its next free name (NAME-2.json or NAME-N.json) beside it: 'WHERE: SENTENCE' each."""
    wrong = []
    for where, text in texts.items():
        for sentence in re.split(r"\.\s+(?=[A-Z`])", " ".join(text.split())):
            if "eval-only" not in sentence or not re.search(r"\b(writes|written|writing)\b", sentence):
                continue
            for name in names:
                if f"{name}.json" in sentence and not re.search(rf"{name}-(2|N)\.json", sentence):
                    at = sentence.index(f"{name}.json")
                    wrong.append(f"{where}: {sentence[max(0, at - 150):at + 50]}")
    return wrong


def test_no_page_help_or_docstring_says_eval_only_writes_a_name_it_may_not_take():
    """Since --eval-only stopped replacing records it did not make (results_files), it writes depth_eval.json or
    reconstruction_eval.json only where OUT holds none, else NAME-2.json (the next free number): every page
    (README, docs/, lab's pages) and every string of the product (docstrings, --help) that says it writes one of
    the names says the other too. The members come from the code, and the check finds the old words."""
    names = results_names()
    assert names == {"depth_eval", "reconstruction_eval"}, names
    pages = ["README.md", "lab/README.md", *glob.glob(os.path.join(ROOT, "docs", "*.md")),
             *glob.glob(os.path.join(ROOT, "lab", "docs", "*.md"))]
    texts = {os.path.relpath(os.path.join(ROOT, p), ROOT): source(p) for p in pages}
    code = ["train.py", "train_loopvae.py", "export.py", "anytime.py", "hubconf.py", "bench.py"]
    for folder in ("training", "loopvae_train", "scripts"):
        code += glob.glob(os.path.join(ROOT, folder, "*.py"))
    for path in code:
        rel = os.path.relpath(os.path.join(ROOT, path), ROOT)
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts[f"{rel}:{node.lineno}"] = node.value
    assert not eval_only_claims(texts, names), eval_only_claims(texts, names)
    old = {"docs/training.md (before)": "`--eval-only --resume OUT/ckpt.pt` (no training: prints accuracy by depth and "
           "writes `depth_eval.json`, plus a PNG, to `--out-dir`: never into `OUT`. Next.", "fixed": "`--eval-only` "
           "writes `depth_eval.json` (`depth_eval-2.json` where OUT holds one). Writes `reconstruction_eval.json`."}
    assert [w.split(": ")[0] for w in eval_only_claims(old, names)] == ["docs/training.md (before)"]


def stale_paths(docs):
    """The paths the pages `docs` name that do not exist ('PAGE:LINE: PATH' each)."""
    stale = []
    for doc in docs:
        rel = os.path.relpath(os.path.join(ROOT, doc), ROOT)
        for n, line in enumerate(source(rel).splitlines(), 1):
            stale += [f"{rel}:{n}: {p}" for p in named_paths(line)
                      if p not in WRITTEN_LATER and not os.path.exists(os.path.join(ROOT, p))
                      and not os.path.exists(os.path.join(ROOT, os.path.dirname(rel), p))]
    for path, writer in WRITTEN_LATER.items():  # (perhaps not written yet: its writer names it)
        assert os.path.basename(path) in source(writer), path
    return stale


def test_test_order_option_reverses_shuffles_by_seed_and_refuses_anything_else():
    """tests/conftest.py's --test-order: reverse is the files' order backwards, random:SEED the same
    permutation for the same seed (every xdist worker must collect one order) and another for another
    seed; any other value is refused."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("rvits_conftest", os.path.join(ROOT, "tests", "conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    items = list(range(50))
    conftest.order_items(items, "files")
    assert items == list(range(50))
    conftest.order_items(items, "reverse")
    assert items == list(range(49, -1, -1))
    a, b, c = list(range(50)), list(range(50)), list(range(50))
    conftest.order_items(a, "random:7"), conftest.order_items(b, "random:7"), conftest.order_items(c, "random:8")
    assert a == b != c and sorted(a) == list(range(50)) and a != list(range(50))
    for bad in ("random", "random:x", "backwards"):
        with pytest.raises(ValueError, match="--test-order"):
            conftest.order_items(list(range(3)), bad)


# ----------------------------------------------------------------------------- every tool's numbers (issue 62, 7 and 9)
# The tools that take flags: train.py (its flags live in training/flags.py) and every file of the top level,
# scripts/ and lab/ that defines one.
def tools(*folders):
    """The files of `folders` that define a flag."""
    return sorted(os.path.relpath(p, ROOT) for d in folders for p in glob.glob(os.path.join(ROOT, d, "*.py"))
                  if "add_argument(" in source(p))


TOOLS = ["train.py", "train_loopvae.py", *tools("", "scripts")]  # (the lab's: lab/tests/test_lab_house.py)
GET_PARSER = {"train.py": "training.flags", "train_loopvae.py": "loopvae_train.flags", "lab/analyze.py": "analyze", "lab/probe.py": "probe"}  # (built without a run)


class Caught(Exception):
    """The parser a tool was about to parse its command line with (tool_parser)."""


def tool_parser(path, monkeypatch):
    """The argparse parser of the tool `path`: its module's get_parser(), else the one its `__main__`
    block builds, caught as it parses (nothing after that runs)."""
    if path in GET_PARSER:
        import importlib
        return importlib.import_module(GET_PARSER[path]).get_parser()
    import argparse
    import runpy
    import sys

    def caught(self, *args, **kwargs):
        raise Caught(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(sys, "argv", [path])
    monkeypatch.setattr(sys, "path", [os.path.dirname(os.path.join(ROOT, path)), *sys.path])  # as `python PATH`
    env = dict(os.environ)
    try:
        with pytest.raises(Caught) as e:
            runpy.run_path(os.path.join(ROOT, path), run_name="__main__")
    finally:  # (scripts/gpu_nested.py sets an inductor variable as it starts: not for the tests after this one)
        os.environ.clear()
        os.environ.update(env)
    return e.value.args[0]


def typed_numbers(parser):
    """(flag, its type, 'int' or 'float') of every flag of `parser` that takes numbers (a number, or a
    list of them): an int flag is one whose values parse as integers, or whose default is an integer."""
    import argparse
    for action in parser._actions:
        if action.type is None or not action.option_strings:
            continue
        for s in ("1", "2", "3", "0.5"):
            try:
                v = action.type(s)
            except (argparse.ArgumentTypeError, TypeError, ValueError):
                continue
            values = v if isinstance(v, list) else [v]
            if values and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
                whole = all(isinstance(x, int) for x in values) or (
                    isinstance(action.default, int) and not isinstance(action.default, bool))
                yield action.option_strings[0], action.type, "int" if whole else "float"
            break


def refuses(kind, s):
    """Whether the argparse type `kind` refuses the value `s` (argparse then says so in one line)."""
    import argparse
    try:
        kind(s)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return True
    return False


def test_tools_are_all_found():
    assert {"train.py", "bench.py", "scripts/gpu_check.py", "scripts/curves.py"} <= set(TOOLS)


@pytest.mark.parametrize("path", TOOLS)
def test_every_number_flag_of_every_tool_refuses_nan_inf_and_a_fraction_where_it_counts(path, monkeypatch, capsys):
    """Issue 62, items 7 and 9: argparse's float() takes nan and inf (and a range check written `v < 0`
    lets NaN through), and an integer flag parsed as a float truncates a fraction (--randaug 0.5 trained
    without RandAugment). Every flag of every tool that takes numbers refuses nan, inf and -inf; every
    integer flag refuses 0.5; and the tool says so in one line (training/flags.py's number types and
    Parser)."""
    check_number_flags(path, monkeypatch, capsys)


def check_number_flags(path, monkeypatch, capsys):
    """The rule of the test above on the tool at `path` (lab/tests/test_lab_house.py applies it to the lab's)."""
    from training.exits import Fail
    parser = tool_parser(path, monkeypatch)
    numbers = list(typed_numbers(parser))
    if not numbers:
        return
    let_through = [f"{flag} {s}" for flag, kind, _ in numbers for s in ("nan", "inf", "-inf", "1e999") if not refuses(kind, s)]
    truncated = [f"{flag} 0.5" for flag, kind, whole in numbers if whole == "int" and not refuses(kind, "0.5")]
    assert not let_through + truncated, f"{path} takes {', '.join(let_through + truncated)}"
    capsys.readouterr()
    with pytest.raises((SystemExit, Fail)) as e:
        parser.error("argument --x: expected a finite number, got 'nan'")
    said = capsys.readouterr().err if e.type is SystemExit else str(e.value)
    assert said.strip().count("\n") == 0 and "expected a finite number" in said, f"{path}: {said!r}"
    assert e.type is Fail or e.value.code == 2


def test_train_py_refuses_each_non_finite_value_of_issue_62_in_one_line(capsys):
    """The five commands of issue 62, item 7, and --randaug 0.5 (item 9): one line, exit status 2."""
    import train
    for argv in (["--lr", "inf"], ["--weight-decay", "nan"], ["--ema", "nan"], ["--drop-path", "nan"],
                 ["--warmup-lr", "inf"], ["--randaug", "0.5"]):
        assert train.cli(argv + ["--print-config"]) == 2, argv  # (before any run: not even the configuration)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"train.py: error: argument {argv[0]}: ") and repr(argv[1]) in err, err


# ----------------------------------------------------------------------------- the docs speak of the project (issue 62)
# How the docs were made, not what the project is: who edited them ("a fourth session", "(a helper)", "I ",
# "my editing", "in this sitting", "this task") and where a paragraph came from ("issue 51 moved them here").
# A terminal's ssh or tmux session, "How do I ...?" and PIL's image mode I are the reader's words, not the making's.
MAKING = re.compile(r"(?<!ssh )(?<!tmux )(?<!login )\bsessions?\b|\bhelpers?\b(?! function)|(?<!do )(?<!mode )\bI\b(?![/-])"
                    r"|\bmy\b|\bsitting\b|\bthis task\b|\bmoved (?:them|it) here\b", re.IGNORECASE)


def making(text):
    """The phrases of `text` that speak of how the docs were made (MAKING), case-sensitive for 'I'."""
    return [m.group(0) for m in MAKING.finditer(text) if m.group(0).lower() != "i" or m.group(0) == "I"]


def test_making_finds_how_the_docs_were_made_and_leaves_the_readers_words():
    made = ("measured in a fourth session; (a helper) tried it; in this session beside my editing; I re-ran it; "
            "in this sitting; no GPU in this task; issue 51 moved them here")
    assert making(made) == ["session", "helper", "session", "my", "I", "sitting", "this task", "moved them here"]
    assert making("How do I add a model? an ssh session drops; mode I images; i.e. a helper function; I/O") == []


def test_the_docs_speak_of_the_project_not_of_how_they_were_made():
    """README and docs/ (the lab's pages: lab/tests/test_lab_house.py): a dated measurement says what ran, on what
    and at which commit; never which session, helper or person made it (issue 62)."""
    found = made_in(["README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))])
    assert not found, found


def made_in(docs):
    """'PAGE: PHRASE' for each phrase of the pages `docs` that speaks of how they were made."""
    found = []
    for doc in docs:
        rel = os.path.relpath(os.path.join(ROOT, doc), ROOT)
        found += [f"{rel}: {m}" for m in making(" ".join(source(rel).split()))]  # (a phrase across lines too)
    return found


def test_the_quick_tier_is_a_registered_marker_that_keeps_every_models_mathematics():
    """README's quick tier (-m "not slow") beside the full command CI runs; `slow` is registered in pytest.ini
    (an unregistered mark would only warn), and no test of the models' own file is left out of the tier."""
    import configparser
    ini = configparser.ConfigParser()
    ini.read(os.path.join(ROOT, "pytest.ini"))
    assert ini["pytest"]["markers"].strip().startswith("slow:")
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert 'python -m pytest -q -n 2 -m "not slow"' in readme
    assert "python -m pytest -q -n 2\n" in open(os.path.join(ROOT, ".ci", "run")).read()
    assert "mark.slow" not in open(os.path.join(ROOT, "test_models.py")).read()


def test_the_product_keeps_its_size_docs_words_and_presets():
    """Issue 78's targets: docs/ (the manuals) at most 25,000 words (whitespace-separated, as `wc -w` counts), and
    at most 45 product presets (the papers' protocols and the first run; the lab's study arms are lab/arms.py's)."""
    import presets
    words = sum(len(open(p, encoding="utf-8").read().split()) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    assert words <= 25_000, f"docs/ holds {words} words"
    assert len(presets.PRESETS) <= 45 and set(presets.PAPER) == set(presets.TIMES) == set(presets.PRESETS)
    assert not [n for n in presets.PRESETS if n.startswith(("c100-mini-", "c100-gpu-"))]  # study arms: lab/arms.py


def test_train_py_help_lists_at_most_85_flags():
    """Issue 78's target: `train.py --help` lists at most 85 flags (argparse's option actions, --help itself not
    counted; 105 at 7e391e0, 86 once LoopVAE's left, 85 once ODEViT's --ode-steps folded into --depth)."""
    import subprocess
    import sys
    from training import flags
    options = [a for a in flags.get_parser()._actions if a.option_strings and "-h" not in a.option_strings]
    assert len(options) <= 85, f"train.py --help lists {len(options)} flags"
    text = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], capture_output=True, text=True,
                          check=True).stdout
    listed = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", text, re.M)) - {"--help"}
    assert listed == {a.option_strings[0] for a in options} and len(listed) <= 85
