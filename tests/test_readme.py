"""The README and docs/*.md as a reader meets them: every snippet runs as written (those that need
torch: tests/test_torch_readme.py) or says why it cannot run here, the README's commands are CI's,
its links lead somewhere, the sample's pasted output is what it prints, and the pages say what the
code does (the CLI's options, the extras)."""

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import doc_snippets  # noqa: E402
from doc_snippets import ROOT, Snippet, all_snippets, python_chains, run_chain, section, snippets  # noqa: E402

README = ROOT / "README.md"
DOCS = ROOT / "docs"


# ---- every snippet is run, here or elsewhere, or says why not


def test_every_snippet_runs_or_says_why_not():
    problems = []
    for snippet in all_snippets():
        kind, text = snippet.marker or (None, "")
        if snippet.language in doc_snippets.RUNNABLE:
            if kind == "not run" and len(text) < 10:
                problems.append(f"{snippet.where}: 'not run' needs a reason")
            elif kind == "run by":
                runner = ROOT / text
                if not (runner.is_file() and snippet.page.name in runner.read_text()):
                    problems.append(f"{snippet.where}: {text} does not exist or does not read {snippet.page.name}")
            elif kind == "exits" and (snippet.language != "sh" or not text.isdigit()):
                problems.append(f"{snippet.where}: 'exits: N' is for sh blocks, with a number")
            elif kind == "output of":
                problems.append(f"{snippet.where}: 'output of' is for text blocks")
        elif snippet.language == "" and snippet.looks_like_a_command():
            problems.append(f"{snippet.where}: a command in a block with no language: mark it sh (or text)")
    assert not problems, "\n".join(problems)


def test_the_rules_are_the_ones_documented():
    rules = section(DOCS / "development.md", "The tests")
    for marker in doc_snippets.MARKERS[:3]:
        assert f"<!-- {marker}:" in rules, marker
    assert sum(s.runs_here for s in all_snippets()) >= 25   # most snippets run here


@pytest.mark.parametrize("page,blocks", python_chains(torch=False), ids=lambda v: getattr(v, "name", ""))
def test_python_snippets_run(page, blocks, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)   # as a reader would run them: not from the clone's root
    run_chain(blocks)


def _sh_snippets():
    return [s for s in all_snippets() if s.language == "sh" and s.runs_here]


@pytest.mark.parametrize("snippet", _sh_snippets(), ids=lambda s: s.where)
def test_sh_snippets_run(snippet: Snippet, tmp_path):
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", snippet.code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == snippet.expected_status, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr


# ---- the README


def test_the_quick_start_comes_first_and_is_short():
    text = README.read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[:2] == ["Quick start", "Contents"]
    quick = section(README, "Quick start")
    blocks = [s for s in snippets(README) if s.code in quick]
    install, numpy_call, torch_call = blocks
    assert "pip install '.[torch]'" in install.code and install.language == "sh"
    assert "acl_swiglu.swiglu_group_quant_grad(" in numpy_call.code and not numpy_call.uses_torch
    assert "from acl_swiglu.torch import" in torch_call.code and torch_call.uses_torch
    code_lines = sum(len([line for line in b.code.splitlines() if line.strip()]) for b in blocks)
    assert code_lines <= 16, code_lines
    assert len(text.splitlines()) <= 160, "the README's details belong in docs/"


def test_the_first_paragraph_says_what_quant_means():
    first = " ".join(README.read_text().split("\n\n")[1].split())
    assert "aclnnSwigluGroupQuantGrad" in first and "aclnnSwigluGroupQuant`" in first
    assert "quantises" in first and "the backward itself quantises nothing" in first


def test_the_contents_lead_to_every_section_and_page():
    contents = section(README, "Contents")
    for title in re.findall(r"^## (.+)$", README.read_text(), flags=re.M)[2:]:
        assert f"(#{doc_snippets.slug(title)})" in contents, title
    for page in ("numpy", "pytorch", "cli", "ascend", "troubleshooting", "development"):
        assert f"docs/{page}.md" in contents, page


def test_links_lead_to_files_and_headings():
    problems = []
    for page in doc_snippets.PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            absolute = re.match(r"https://(?:github\.com/acl-swiglu/acl-swiglu/blob|"
                                r"raw\.githubusercontent\.com/acl-swiglu/acl-swiglu)/main/(.+)", target)
            if absolute:
                path, _, anchor = absolute.group(1).partition("#")
                file = ROOT / path
            elif not re.match(r"[a-z]+://", target):
                path, _, anchor = target.partition("#")
                file = page.parent / path if path else page
            else:
                continue
            if not file.is_file():
                problems.append(f"{page.name}: {target}: no {file.relative_to(ROOT)}")
            elif anchor and file.suffix == ".md" and anchor not in doc_snippets.anchors(file):
                problems.append(f"{page.name}: {target}: no heading #{anchor} in {file.name}")
    assert not problems, "\n".join(problems)


def test_the_two_commands_are_the_ci_commands():
    commands = [s.code.strip() for s in snippets(README) if s.code.strip().startswith("python3 -m venv")]
    assert commands == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && acl-swiglu-sample",
        "python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints/ci.txt '.[test,torch]' && pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run exactly the README's test command"
    # the default run deselects the slow tier; CI runs it right after, and the README says so
    lines = ci.splitlines()
    test_step = next(i for i, line in enumerate(lines) if commands[1] in line)
    assert lines[test_step + 1] == "pytest -m slow", ".ci/run must run the slow tier after the test command"
    assert "pytest -m slow" in README.read_text()


def test_the_extras_the_pages_name_exist():
    extras = set(metadata.metadata("acl-swiglu").get_all("Provides-Extra"))
    named = set()
    for page in doc_snippets.PAGES:
        for group in re.findall(r"pip install (?:-e |-c \S+ )*'\.\[([a-z,]+)\]'", page.read_text()):
            named.update(group.split(","))
    assert named and named <= extras, named - extras
    assert {"torch", "test", "plot"} <= named


def test_pip_show_names_the_authors_and_maintainers():
    installed = metadata.metadata("acl-swiglu")
    assert installed["Author"] == "acl-swiglu developers" and installed["Maintainer"] == "acl-swiglu developers"


# ---- the sample's page


def test_pasted_sample_output_is_what_the_sample_prints(tmp_path):
    [pasted] = [s for s in snippets(DOCS / "cli.md") if s.marker and s.marker[0] == "output of"
                and s.marker[1].startswith("acl-swiglu-sample ")]
    script = shutil.which("acl-swiglu-sample", path=os.path.dirname(sys.executable))
    assert script, "the acl-swiglu-sample console script is not installed next to this Python"
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    result = subprocess.run([script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr

    def normalise(text):   # the install path differs from machine to machine
        return re.sub(r"(root |library: )\S*site-packages", r"\1/…/site-packages", text).strip()

    assert normalise(result.stdout) == normalise(pasted.code)


def test_the_options_table_has_every_option():
    from acl_swiglu import cli

    table = section(DOCS / "cli.md", "Options")
    options = {o for action in cli.build_parser()._actions for o in action.option_strings if o.startswith("--")}
    first_cells = re.findall(r"^\| (.+?) \| ", table, flags=re.M)
    documented = {option for cell in first_cells for option in re.findall(r"`(--[a-z-]+)", cell)}
    assert documented == options - {"--help"}, (options - documented, documented - options)
