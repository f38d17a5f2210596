"""The files a vLLM pipeline uses: `action.yml` (the GitHub Action), `.pre-commit-hooks.yaml` and
the Buildkite step of docs/ci.md. Each is parsed, and its commands run on this machine as the CI
would run them: the Action's scripts with GitHub's shell and its inputs, outputs where the
Action uploads them; the hooks through pre-commit itself; the Buildkite step's pcpcheck command."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from fresh_env import GATHER_FILE, ROOT, copy_tracked, make_venv, venv_env, vllm_checkout

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HOME, VERSION = PROJECT["urls"]["Repository"], PROJECT["version"]
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
# the files of vLLM's PCP KV-cache path whose change triggers a check (docs/ci.md)
PCP_FILES = ["vllm/v1/attention/ops/pcp.py", "vllm/model_executor/layers/attention/pcp.py",
             "vllm/v1/worker/gpu/pcp_manager.py", "vllm/v1/worker/gpu/block_table.py",
             "vllm/model_executor/layers/attention/mla_attention.py",
             "vllm/model_executor/layers/sparse_attn_indexer.py", ".pcpcheck-baseline"]
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
GITHUB_SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]  # GitHub's `shell: bash`
pytestmark = pytest.mark.xdist_group("ci-files")  # one venv for the module


def steps_named() -> dict[str, dict]:
    return {step.get("name") or step.get("uses"): step for step in ACTION["runs"]["steps"]}


def test_the_action_declares_every_input_it_reads_and_keeps_expressions_out_of_scripts():
    text = (ROOT / "action.yml").read_text()
    used = set(re.findall(r"\binputs\.([\w-]+)", text))  # in ${{ }} and in bare `if:` conditions
    assert used == set(ACTION["inputs"]), used ^ set(ACTION["inputs"])
    assert all(spec.get("description") for spec in ACTION["inputs"].values())
    assert ACTION["runs"]["using"] == "composite"
    for step in ACTION["runs"]["steps"]:
        assert "run" not in step or "${{" not in step["run"], step.get("name")
    upload = steps_named()["actions/upload-artifact@v4"]
    assert upload["if"] == "always()" and upload["with"]["path"] == "${{ inputs.output-dir }}"
    assert ACTION["outputs"]["exit-code"]["value"] == "${{ steps.check.outputs.exit-code }}"


def _evaluate(value: str, inputs: dict[str, str], action_path: Path) -> str:
    def one(match) -> str:
        expression = match.group(1)
        if expression == "github.action_path":
            return str(action_path)
        assert expression.startswith("inputs."), expression
        return inputs[expression.split(".", 1)[1]]
    return EXPRESSION.sub(one, str(value))


def run_step(name: str, venv: Path, cwd: Path, action_path: Path, **given: str) -> dict:
    """The step's script as GitHub runs it: its env from the inputs (defaults, then `given`),
    GITHUB_OUTPUT and GITHUB_STEP_SUMMARY files; returns the exit code, output and both files."""
    step = steps_named()[name]
    inputs = {key: str(spec.get("default", "")) for key, spec in ACTION["inputs"].items()}
    inputs.update({key.replace("_", "-"): value for key, value in given.items()})
    env = {key: _evaluate(value, inputs, action_path) for key, value in step.get("env", {}).items()}
    files = {"GITHUB_OUTPUT": cwd / ".github_output", "GITHUB_STEP_SUMMARY": cwd / ".step_summary"}
    for path in files.values():
        path.write_text("")
    script = cwd / ".step.sh"
    script.write_text(step["run"])
    done = subprocess.run([*GITHUB_SHELL, str(script)], capture_output=True, text=True, cwd=cwd,
                          env=venv_env(venv, **env, **{k: str(v) for k, v in files.items()}),
                          timeout=600)
    outputs = dict(line.split("=", 1) for line in files["GITHUB_OUTPUT"].read_text().splitlines())
    return {"code": done.returncode, "out": done.stdout + done.stderr, "outputs": outputs,
            "summary": files["GITHUB_STEP_SUMMARY"].read_text()}


@pytest.fixture(scope="module")
def action(tmp_path_factory) -> tuple[Path, Path]:
    """(venv, action_path): the Action's install step run in a fresh venv, installing pcpcheck
    from a copy of this repository (the Action's checkout at its tag). The host's packages
    stand in for the index (pip-args), as `pip install torch ...` would fetch them."""
    base = tmp_path_factory.mktemp("action")
    venv, action_path = make_venv(base / "venv"), copy_tracked(base / "action")
    step = run_step("Install pcpcheck", venv, base, action_path, torch_index="",
                    pip_args="--no-deps --no-build-isolation --no-index --quiet")
    assert step["code"] == 0, step["out"][-3000:]
    assert re.search(r"^pcpcheck \d+\.\d+", step["out"], re.M), step["out"][-3000:]
    return venv, action_path


def test_the_action_checks_a_checkout_and_writes_where_it_uploads(action, tmp_path):
    venv, action_path = action
    checkout = vllm_checkout(tmp_path / "vllm", manager="bug13_decodes_not_prefix.py")
    step = run_step("pcpcheck vllm", venv, checkout, action_path, regimes="replicated",
                    max_examples="100")
    assert (step["code"], step["outputs"]) == (1, {"exit-code": "1"}), step["out"][-3000:]
    out = checkout / ACTION["inputs"]["output-dir"]["default"]  # the upload step's path
    for name in ("pcpcheck.json", "pcpcheck.xml", "summary.md", "report.txt", "html/index.html"):
        assert (out / name).is_file(), name
    assert "| LAYOUT | " in step["summary"] and "FAIL **new**" in step["summary"]
    assert "::error::pcpcheck exited 1" in step["out"]
    # the baseline input's default file, when the checkout has it, makes the violations known
    (checkout / ".pcpcheck-baseline").write_text(
        "replicated LAYOUT\nreplicated COLLECTIVE\nreplicated REPLICA\n")
    step = run_step("pcpcheck vllm", venv, checkout, action_path, regimes="replicated",
                    max_examples="100")
    assert (step["code"], step["outputs"]) == (0, {"exit-code": "0"}), step["out"][-3000:]
    assert "FAIL (known)" in step["summary"]


def test_the_action_holds_on_a_correct_checkout_with_its_defaults(action, tmp_path):
    venv, action_path = action
    checkout = vllm_checkout(tmp_path / "vllm")
    step = run_step("pcpcheck vllm", venv, checkout, action_path, max_examples="40")
    assert (step["code"], step["outputs"]) == (0, {"exit-code": "0"}), step["out"][-3000:]
    assert "every invariant holds" in step["summary"]
    assert " --budget 900 " in step["out"].splitlines()[0] + " "


def test_the_actions_mode_input(action, tmp_path):
    venv, action_path = action
    checkout = vllm_checkout(tmp_path / "vllm")
    # one regime, a short budget: what is tested is the command the mode makes, not the search
    step = run_step("pcpcheck vllm", venv, checkout, action_path, mode="exhaustive",
                    regimes="replicated", budget="3")
    assert " --exhaustive" in step["out"].splitlines()[0]  # pcpcheck's exhaustive search
    assert re.search(r"^exhaustive: [\d,]+ of [\d,]+ steps", step["out"], re.M), step["out"][-3000:]
    # the job summary says what the bounded claim covered, and that the budget cut it short
    assert re.search(r"^exhaustive: [\d,]+ of [\d,]+ steps .*: the budget ran out$",
                     step["summary"], re.M), step["summary"]
    assert "The budget of 3 s was reached" in step["summary"]
    step = run_step("pcpcheck vllm", venv, checkout, action_path, mode="sometimes")
    assert (step["code"], step["outputs"]) == (2, {"exit-code": "2"})
    assert "::error::pcpcheck: mode must be random or exhaustive, got 'sometimes'" in step["out"]


def test_the_actions_changed_against_input_puts_the_lines_not_exercised_in_the_job_summary(
        action, tmp_path):
    venv, action_path = action
    base, checkout = vllm_checkout(tmp_path / "base"), vllm_checkout(tmp_path / "vllm")
    with (checkout / GATHER_FILE).open("a") as gather:  # a function no step calls
        gather.write("\n\ndef pcpcheck_uncalled():\n    return 0\n")
    step = run_step("pcpcheck vllm", venv, checkout, action_path, regimes="replicated",
                    max_examples="20", changed_against=str(base))
    assert step["code"] == 0, step["out"][-3000:]
    assert f" --changed-against {base}" in step["out"].splitlines()[0]
    assert f"#### Changed lines against `{base}`" in step["summary"], step["summary"]
    assert f"- `{GATHER_FILE}:" in step["summary"] and "in `pcpcheck_uncalled`" in step["summary"]


def test_the_hooks_run_on_the_pcp_files_only():
    assert [hook["id"] for hook in HOOKS] == ["pcpcheck", "pcpcheck-system"]
    assert [hook["language"] for hook in HOOKS] == ["python", "system"]
    for hook in HOOKS:
        assert hook["pass_filenames"] is False and hook["entry"] == HOOKS[0]["entry"]
        assert all(re.search(hook["files"], path) for path in PCP_FILES)
        assert not any(re.search(hook["files"], path) for path in (
            "vllm/v1/worker/gpu/model_runner.py", "tests/v1/attention/ops/pcp.py", "README.md"))
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-manifest",
                           str(ROOT / ".pre-commit-hooks.yaml")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                   check=True, capture_output=True, timeout=300)


def test_pre_commit_runs_the_system_hook_in_a_vllm_checkout(action, tmp_path):
    """pre-commit itself reads the hooks file of this repository (try-repo) and runs the hook
    with the pcpcheck the Action installed on PATH: skipped for other files, a pass on a
    correct checkout, a failure on a wrong layout."""
    venv, action_path = action
    _git(action_path, "init", "-q")
    _git(action_path, "add", "-A")
    _git(action_path, "commit", "-qm", "pcpcheck")
    env = venv_env(venv, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    for manager, files, expected in ((None, "README.md", 0), (None, PCP_FILES[2], 0),
                                     ("bug13_decodes_not_prefix.py", PCP_FILES[2], 1)):
        checkout = vllm_checkout(tmp_path / f"vllm-{manager}-{files.replace('/', '_')}", manager)
        (checkout / "README.md").write_text("vLLM\n")
        _git(checkout, "init", "-q")
        _git(checkout, "add", "-A")
        _git(checkout, "commit", "-qm", "vllm")
        done = subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(action_path),
                               "pcpcheck-system", "--files", files], capture_output=True,
                              text=True, cwd=checkout, env=env, timeout=600)
        assert done.returncode == expected, done.stdout[-3000:] + done.stderr[-2000:]
        assert ("(no files to check)Skipped" if files == "README.md"
                else "Failed" if expected else "Passed") in done.stdout
        if expected:  # the verdict's failure (exit 1), not a load error (exit 2)
            assert "- exit code: 1" in done.stdout and "LAYOUT violated" in done.stdout


def ci_doc_block(heading: str, language: str = "yaml") -> str:
    text = (ROOT / "docs" / "ci.md").read_text().split(f"\n{heading}\n", 1)[1]
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_buildkite_step_triggers_on_the_pcp_files_and_its_command_runs(action, tmp_path):
    venv, _ = action
    (step,) = yaml.safe_load(ci_doc_block("## Buildkite"))
    assert step["source_file_dependencies"] == PCP_FILES
    checkout = vllm_checkout(tmp_path / "vllm")
    (checkout / ".pcpcheck-baseline").write_text("# none known\n")
    commands = [c for c in step["commands"] if c.startswith("pcpcheck ")]
    assert commands
    for command in commands:
        command = command.replace("--budget 900", "--budget 900 --max-examples 30")
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, cwd=checkout,
                              env=venv_env(venv), timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_github_workflow_of_docs_ci_triggers_on_the_pcp_files():
    workflow = yaml.safe_load(ci_doc_block("## GitHub Actions"))
    assert workflow[True]["pull_request"]["paths"] == PCP_FILES  # yaml reads `on` as True
    uses = [s.get("uses", "") for s in workflow["jobs"]["pcpcheck"]["steps"]]
    assert f"{HOME.removeprefix('https://github.com/')}@v{VERSION}" in uses, uses


def test_every_integration_installs_the_kernels_extra_a_cpu_torch_and_pcpchecks_home():
    """In a CI the slot-mapping stage runs the release's own kernels (the kernels extra), and
    torch comes from PyTorch's CPU index, never pip's default (a CUDA build of several GB)."""
    install = steps_named()["Install pcpcheck"]["run"]
    assert ACTION["inputs"]["torch-index"]["default"] == CPU_TORCH_INDEX
    assert '--index-url "$PCPCHECK_TORCH_INDEX"' in install
    assert 'install $PCPCHECK_PIP_ARGS "$PCPCHECK_PACKAGE[kernels]"' in install
    assert install.index("$PCPCHECK_TORCH\"") < install.index("[kernels]")  # torch first
    (step,) = yaml.safe_load(ci_doc_block("## Buildkite"))
    torch, package = (c for c in step["commands"] if c.startswith("pip install"))
    assert shlex.split(torch)[2:] == ["torch>=2.4,<2.15", "--index-url", CPU_TORCH_INDEX], torch
    assert shlex.split(package)[2:] == [f"pcpcheck[kernels] @ git+{HOME}@v{VERSION}"], package
    (python_hook,) = [hook for hook in HOOKS if hook["language"] == "python"]
    assert python_hook["additional_dependencies"] == [f"--extra-index-url={CPU_TORCH_INDEX}",
                                                      ".[kernels]"]
    hook_config = yaml.safe_load(ci_doc_block("## pre-commit"))
    assert [repo["repo"] for repo in hook_config["repos"]] == [HOME]
    assert "YOUR_" not in (ROOT / "README.md").read_text() + (ROOT / "docs" / "ci.md").read_text()


SHARDS_HEADING = "## A scope no single job could: `--shard K/N` and `pcpcheck merge`"


def test_the_sharded_buildkite_jobs_of_docs_ci_run_and_merge(action, tmp_path):
    """docs/ci.md's `parallelism: 3` step, each job's command as its shell expands it (a small
    scope), then the merge step's: one verdict over the three parts."""
    venv, _ = action
    text = (ROOT / "docs" / "ci.md").read_text().split(f"\n{SHARDS_HEADING}\n", 1)[1]
    github, buildkite = (yaml.safe_load(block.split("```", 1)[0])
                         for block in text.split("```yaml\n")[1:3])
    matrix = github["jobs"]["pcpcheck"]["strategy"]["matrix"]["shard"]
    assert matrix == ["1/3", "2/3", "3/3"]
    assert github["jobs"]["pcpcheck"]["steps"][1]["with"]["shard"] == "${{ matrix.shard }}"
    jobs, _, merging = buildkite
    checkout = vllm_checkout(tmp_path / "vllm")
    (command,) = [c for c in jobs["commands"] if c.startswith("pcpcheck ")]
    for job in range(jobs["parallelism"]):
        done = subprocess.run(["bash", "-c", command.replace("$$", "$") + " --regime replicated "
                               "--scope ranks=2,requests=1,tokens=3"], cwd=checkout,
                              capture_output=True, text=True, timeout=600,
                              env=venv_env(venv, BUILDKITE_PARALLEL_JOB=str(job),
                                           BUILDKITE_PARALLEL_JOB_COUNT=str(jobs["parallelism"])))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (merge,) = [c for c in merging["commands"] if c.startswith("pcpcheck ")]
    done = subprocess.run(["bash", "-c", merge], cwd=checkout, capture_output=True, text=True,
                          timeout=600, env=venv_env(venv))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "pcpcheck merge: 3 of 3 shard(s)" in done.stdout and (checkout / "pcpcheck.xml").is_file()
    assert re.search(r"^exhaustive: [\d,]+ steps .*: every invariant holds$", done.stdout, re.M)
