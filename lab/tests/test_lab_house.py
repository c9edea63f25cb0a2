"""The lab's side of the house (issue 78, tests/test_house.py the product's): the lab's tools reach the product
through training/ and the models' public API, never by importing train.py; its pages name files that exist and
speak of the project; every number flag of its tools refuses nan, inf and a fraction where it counts."""
import glob
import os

import pytest

from test_house import ROOT, check_number_flags, check_package_docstring, imports, made_in, stale_paths, tools

LAB_TOOLS = tools("lab")
PAGES = ["lab/README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "lab", "docs", "*.md")))]


@pytest.mark.parametrize("path", sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "lab", "*.py"))))
def test_lab_tools_import_training_not_the_tutorial(path):
    """A subprocess running train.py is fine; importing it is not."""
    assert "train" not in imports(path), path


def test_analysis_package_is_a_docstring_naming_each_module():
    check_package_docstring(os.path.join("lab", "analysis"))


def test_every_path_the_lab_pages_name_exists():
    """lab/README.md and lab/docs/ name files a reader runs or opens: each exists. lab/results/*/README.md are
    dated records of their commit and are not read."""
    stale = stale_paths(PAGES)
    assert not stale, stale


def test_the_lab_pages_speak_of_the_project_not_of_how_they_were_made():
    found = made_in(PAGES + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "lab", "results",
                                                                                           "*", "README.md"))))
    assert not found, found


def test_lab_tools_are_all_found():
    assert {"lab/analyze.py", "lab/probe.py", "lab/gpu_study.py", "lab/summarize_anytime.py",
            "lab/summarize_loopvae.py", "lab/bench_anytime.py"} <= set(LAB_TOOLS)


@pytest.mark.parametrize("path", LAB_TOOLS)
def test_every_number_flag_of_every_lab_tool_refuses_nan_inf_and_a_fraction_where_it_counts(path, monkeypatch, capsys):
    """tests/test_house.py's rule for the lab's tools (issue 62, items 7 and 9)."""
    check_number_flags(path, monkeypatch, capsys)
