"""The real command line: `topasd trace gen` and `topasd replay` on real files.

Expected errors (bad input) must print one line `error: ...` on stderr, exit
with code 2, and never show a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.simkit import builtin_present
from topasd.cli import main
from topasd.scheduler import POLICY_NAMES
from workflows.builtin import BUILTIN, load_workload
from workflows.trace import load_trace

RUN_KEYS = {
    "policy", "tasks", "mean_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s",
    "throughput_req_s", "first_task_s", "mean_batch", "peak_batch", "prefix_loads",
    "prefix_load_gb", "prefix_computes", "preemptions", "retractions", "recomputed_tokens",
    "decisions", "decision_mean_ms", "decision_p99_ms",
}

SPEC = {
    "name": "clitest",
    "description": "plan -> {code, test} -> review",
    "agents": {"P": {"prefix_tokens": 300}, "C": {"prefix_tokens": 500},
               "R": {"prefix_tokens": 200}},
    "stages": [
        {"name": "plan", "agent": "P", "input_tokens": 100, "output_tokens": 60},
        {"name": "code", "agent": "C", "after": ["plan"], "output_tokens": 80,
         "rounds": {"uniform_int": [1, 3]}, "tool_wait_s": 0.5, "history": "parents"},
        {"name": "test", "agent": "C", "after": ["plan"], "output_tokens": 40},
        {"name": "review", "agent": "R", "after": ["code", "test"], "output_tokens": 30,
         "history": "ancestors"},
    ],
    "operating_points": [0.5, 1.0, 2.0],
}


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "topasd.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def assert_clean_error(code: int, stdout: str, stderr: str) -> str:
    assert code == 2, (code, stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert stdout == ""
    return lines[0]


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "clitest.yaml"
    path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    return path


@pytest.fixture
def trace_file(tmp_path: Path, spec_file: Path) -> Path:
    out = tmp_path / "clitest.jsonl"
    res = invoke("trace", "gen", "-w", str(spec_file), "-r", "1.0", "-n", "12", "-s", "4",
                 "-o", str(out))
    assert res.exit_code == 0, res.output
    return out


# --------------------------------------------------------------------------
# trace gen
# --------------------------------------------------------------------------


def test_trace_gen_writes_a_loadable_trace(tmp_path: Path, spec_file: Path) -> None:
    out = tmp_path / "t.jsonl"
    res = invoke("trace", "gen", "-w", str(spec_file), "-r", "2", "-n", "30", "-o", str(out))
    assert res.exit_code == 0
    assert res.stdout == ""
    assert res.stderr.startswith("wrote 30 tasks") and res.stderr.strip().endswith(f"to {out}")
    trace = load_trace(out)
    assert len(trace.tasks) == 30 and set(trace.workflows) == {"clitest"}
    assert trace.meta["rate"] == 2.0 and trace.meta["seed"] == 0
    n_req = sum(len(r) for t in trace.tasks for r in t.stages.values())
    assert f"{n_req} requests" in res.stderr


def test_trace_gen_is_reproducible(tmp_path: Path, spec_file: Path) -> None:
    a, b, c = (tmp_path / f"{x}.jsonl" for x in "abc")
    for out, seed in ((a, "7"), (b, "7"), (c, "8")):
        assert invoke("trace", "gen", "-w", str(spec_file), "-r", "1", "-n", "10", "-s", seed,
                      "-o", str(out)).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize(("args", "says"), [
    (["-w", "nonexistent", "-r", "1"], "unknown workload 'nonexistent'"),
    # a mistyped spec path is named as a missing file, not as an unknown workload
    (["-w", "nosuch.yaml", "-r", "1"], "workflow spec file 'nosuch.yaml' does not exist"),
    (["-w", "chain3", "-r", "0"], "rate must be a finite number > 0"),
    (["-w", "chain3", "-r", "nan", "-n", "3"], "rate must be a finite number > 0"),
])
def test_trace_gen_errors(tmp_path: Path, args: list[str], says: str) -> None:
    res = invoke("trace", "gen", *args, "-o", str(tmp_path / "x.jsonl"))
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert says in line


# --------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------


def replay_json(*args: str) -> dict:
    res = invoke("replay", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def check_runs(data: dict, policies: list[str], tasks: int) -> None:
    runs = data["runs"]
    assert [r["policy"] for r in runs] == policies
    for row in runs:
        assert set(row) >= RUN_KEYS, RUN_KEYS - set(row)
        assert row["tasks"] == tasks
        assert 0 < row["mean_jct_s"] <= row["makespan_s"] + 1e-9
        assert row["p50_jct_s"] <= row["p99_jct_s"] <= row["makespan_s"] + 1e-9
        assert 0 < row["first_task_s"] <= row["makespan_s"] + 1e-9
        assert row["peak_batch"] >= 1 and row["decisions"] >= 1


@pytest.mark.parametrize("name", BUILTIN)
def test_replay_every_builtin_with_all_policies(name: str) -> None:
    builtin_present(name)
    data = replay_json("--workload", name, "--policy", "all", "--tasks", "20")
    check_runs(data, list(POLICY_NAMES), 20)
    points = load_workload(name).operating_points
    assert data["trace"]["rate"] == points[len(points) // 2]  # the middle operating point
    assert data["trace"]["tasks"] == 20
    assert data["profile"] == "qwen2.5-32b-a100"


def test_replay_trace_file(trace_file: Path) -> None:
    data = replay_json(str(trace_file), "-p", "fcfs", "-p", "spf", "-p", "fcfs",
                       "--profile", "small")
    check_runs(data, ["fcfs", "spf"], 12)  # a repeated policy runs once
    assert data["profile"] == "small"
    assert data["trace"]["workload"] == "clitest"


def test_replay_is_deterministic(trace_file: Path) -> None:
    def rows() -> list[dict]:
        data = replay_json(str(trace_file), "-p", "lpm", "-p", "autellix-las")
        for row in data["runs"]:  # wall-clock fields differ between runs
            for key in [k for k in row if k.startswith("decision_") or k == "wall_s"]:
                del row[key]
        return data["runs"]

    assert rows() == rows()


def test_replay_table(trace_file: Path) -> None:
    res = invoke("replay", str(trace_file), "-p", "fcfs", "-p", "lpm")
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("workload clitest, rate 1.0 task/s, 12 tasks")
    assert lines[1].split()[:2] == ["policy", "mean"]
    assert [ln.split()[0] for ln in lines[2:]] == ["fcfs", "lpm"]


def test_replay_params_tune_only_the_topas_policies(trace_file: Path) -> None:
    plain = replay_json(str(trace_file), "-p", "topas", "-p", "fcfs", "--profile", "small")
    tuned = replay_json(str(trace_file), "-p", "topas", "-p", "fcfs", "--profile", "small",
                        "--param", "preempt=false", "--param", "K=1", "--param", "hol_age=0")
    assert tuned["runs"][0]["params"] == {"preempt": False, "k": 1, "hol_age": 0}
    assert tuned["runs"][0]["preemptions"] == 0
    assert "params" not in tuned["runs"][1]  # the baseline runs as it is
    assert tuned["runs"][1]["mean_jct_s"] == plain["runs"][1]["mean_jct_s"]
    res = invoke("replay", str(trace_file), "-p", "topas", "--param", "rho=3")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == "TOPAS parameters: rho=3"
    # shown (and recorded) as the policy took them, not as typed
    res = invoke("replay", str(trace_file), "-p", "topas", "--param", "K=1e2", "--param", "M=6.0")
    assert res.stdout.strip().splitlines()[-1] == "TOPAS parameters: k=100, m=6"


@pytest.mark.parametrize(("args", "says"), [
    (["-p", "nope"], "unknown policy 'nope'"),
    (["--workload", "chain3"], "not both"),
    (["-p", "fcfs", "--param", "rho=3"], "no TOPAS policy is selected"),
    (["-p", "topas", "--param", "hol_age=-1"], "hol_age=-1 is out of range"),
    (["-p", "topas", "--param", "rho=abc"], "rho='abc' is not a number: use a number in"),
    (["-p", "fcfs", "--clock", "cpu"], "--clock needs --backend vllm"),
    (["-p", "topas", "--param", "preempt=maybe"], "must be true or false"),
    (["-p", "topas", "--param", "gamma=1"], "gamma"),
    (["-p", "topas", "--param", "rho"], "expected NAME=VALUE"),
    (["-p", "topas", "--param", "beta=3", "--param", "Beta=5"],
     "--param: Beta is given twice; give each parameter once"),
    (["--rate", "5"], "--rate only shapes a trace made from --workload"),
    (["-n", "1000", "--seed", "9"], "--tasks, --seed only shape a trace"),
])
def test_replay_usage_errors(trace_file: Path, args: list[str], says: str) -> None:
    res = invoke("replay", str(trace_file), *args)
    assert says in assert_clean_error(res.exit_code, res.stdout, res.stderr)


def test_replay_needs_a_trace_or_workload(tmp_path: Path) -> None:
    res = invoke("replay")
    assert "TRACE_FILE" in assert_clean_error(res.exit_code, res.stdout, res.stderr)
    res = invoke("replay", str(tmp_path / "missing.jsonl"))
    assert "cannot read trace" in assert_clean_error(res.exit_code, res.stdout, res.stderr)


# --------------------------------------------------------------------------
# Malformed traces through the real CLI (a fresh interpreter)
# --------------------------------------------------------------------------


def largest_request(trace_file: Path) -> int:
    trace = load_trace(trace_file)
    return max(trace.workflows[t.workflow].prefix_tokens(v) + r.input_tokens + r.output_tokens
               for t in trace.tasks for v, rounds in t.stages.items() for r in rounds)


def rewrite(path: Path, lineno: int, change) -> None:
    """Apply `change` to line `lineno` (1-based) of a trace file: to the parsed
    record if `change` takes a dict, else to the raw text."""
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = change(lines[lineno - 1])
    path.write_text("".join(lines))


def edit(fn):
    def apply(line: str) -> str:
        rec = json.loads(line)
        fn(rec)
        return json.dumps(rec) + "\n"

    return apply


def _stage(rec: dict, name: str) -> dict:
    return next(s for s in rec["spec"]["stages"] if s["name"] == name)


# case -> (line to corrupt, change, extra replay args, what the message must say)
MALFORMED = {
    "truncated-json": (5, lambda line: line[: len(line) // 2], [], "not valid JSON"),
    "missing-field": (4, edit(lambda r: r.pop("stages")), [], "lacks field 'stages'"),
    "unknown-workflow": (6, edit(lambda r: r.update(workflow="ghostflow")), [],
                         "'ghostflow'"),
    "cyclic-dag": (2, edit(lambda r: _stage(r, "plan")["after"].append("review")), [],
                   "cycle"),
    "unknown-agent": (2, edit(lambda r: _stage(r, "test").update(agent="Ghost")), [],
                      "unknown agent 'Ghost'"),
    "over-budget": (None, None, ["--budget"], "KV budget"),
}


def malformed_trace(trace_file: Path, case: str) -> tuple[list[str], int | None]:
    lineno, change, extra, _ = MALFORMED[case]
    if change is not None:
        rewrite(trace_file, lineno, change)
    args = list(extra)
    if args == ["--budget"]:
        args.append(str(largest_request(trace_file) - 1))
    return args, lineno


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_trace_is_one_clear_line(trace_file: Path, case: str) -> None:
    args, _ = malformed_trace(trace_file, case)
    proc = run_cli("replay", str(trace_file), "-p", "fcfs", *args)
    line = assert_clean_error(proc.returncode, proc.stdout, proc.stderr)
    assert MALFORMED[case][3] in line


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_trace_error_names_the_line(trace_file: Path, case: str) -> None:
    args, lineno = malformed_trace(trace_file, case)
    if lineno is None:  # the oversized request's task line
        trace = load_trace(trace_file)
        need = int(args[-1]) + 1
        big = next(t for t in trace.tasks for v, rounds in t.stages.items() for r in rounds
                   if trace.workflows[t.workflow].prefix_tokens(v) + r.input_tokens
                   + r.output_tokens == need)
        lineno = 1 + len(trace.workflows) + 1 + big.id  # task ids follow the file order
    res = invoke("replay", str(trace_file), "-p", "fcfs", *args)
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert f"{trace_file}:{lineno}:" in line


def test_over_budget_by_exactly_zero_is_fine(trace_file: Path) -> None:
    data = replay_json(str(trace_file), "-p", "fcfs", "--budget", str(largest_request(trace_file)))
    check_runs(data, ["fcfs"], 12)


def test_doc_example_replays(tmp_path: Path) -> None:
    """docs/trace-format.md's example runs with the command the doc gives."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "trace-format.md").read_text()
    example = doc[doc.index("```jsonl\n") + len("```jsonl\n"):]
    example = example[:example.index("```")]
    path = tmp_path / "example.jsonl"
    path.write_text(example)
    assert "topasd replay example.jsonl --profile small --policy all" in doc
    data = replay_json(str(path), "--profile", "small", "--policy", "all")
    check_runs(data, list(POLICY_NAMES), 2)


# --------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------


@contextmanager
def _stand_in_daemon(tmp_path: Path, code: int, state: dict[str, Any],
                     info: dict[str, Any] | None = None) -> Iterator[Path]:
    """A runtime file naming a live process and an HTTP server that answers
    GET /v1/state with `code` and `state`: what `status` reads."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(state).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stand_in = _sleeper("topasd-stand-in")  # a live process that names topasd
    cmdline = Path(f"/proc/{stand_in.pid}/cmdline")
    for _ in range(500):  # until it has exec'd (before, it shows pytest's command line)
        if not cmdline.exists() or b"topasd-stand-in" in cmdline.read_bytes():
            break
        time.sleep(0.01)
    try:
        runtime = tmp_path / "rt.json"
        runtime.write_text(json.dumps({"pid": stand_in.pid, "url": (
            f"http://127.0.0.1:{server.server_address[1]}"), **(info or {})}))
        yield runtime
    finally:
        server.shutdown()
        stand_in.kill()
        stand_in.wait()


def test_status_reports_a_daemon_that_answers_with_an_error(tmp_path: Path) -> None:
    """A daemon that answers GET /v1/state with an error is reported as such
    (one line, its message), not as an idle daemon."""
    error = {"error": {"message": "internal error (Boom)", "type": "x", "code": 500}}
    with _stand_in_daemon(tmp_path, 500, error) as runtime:
        res = invoke("status", "--runtime-file", str(runtime))
        line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
        assert "with 500: internal error (Boom)" in line


def test_status_names_the_search_and_paces_only_the_simulator(tmp_path: Path) -> None:
    """The speed paces the simulator alone: a vLLM daemon's status names its
    backend instead; both say which TOPAS search runs."""
    state = {"policy": "topas", "t": 12.5, "speed": 1.0, "counts": {"decisions": 3}}
    search = "compiled (mypyc 2.4.1)"
    for backend, shown, hidden in (("sim", ", speed 1.0", "backend"),
                                   ("vllm", ", vllm backend", "speed")):
        with _stand_in_daemon(tmp_path, 200, state, {"backend": backend,
                                                     "search": search}) as runtime:
            res = invoke("status", "--runtime-file", str(runtime))
        assert res.exit_code == 0, res.output
        assert f"policy topas, engine t=12.5s{shown}\n" in res.stdout
        assert hidden not in res.stdout.splitlines()[1]
        assert f"TOPAS search: {search}" in res.stdout


def _sleeper(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args])


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_stale_runtime_file_whose_pid_is_another_program_is_not_signalled(
        tmp_path: Path) -> None:
    """A daemon killed with SIGKILL leaves its runtime file; once its pid
    belongs to another program, `stop` must not send that program SIGTERM (it
    did), and `status` reports no daemon."""
    other = _sleeper("not-a-daemon")
    try:
        runtime = tmp_path / "rt.json"
        runtime.write_text(json.dumps({"pid": other.pid, "url": "http://127.0.0.1:9"}))
        for command in ("stop", "status"):
            res = invoke(command, "--runtime-file", str(runtime))
            line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
            assert "no daemon running" in line
        assert other.poll() is None  # never signalled
        runtime.write_text(json.dumps({"pid": 2**70, "url": "http://127.0.0.1:9"}))
        res = invoke("stop", "--runtime-file", str(runtime))  # a pid beyond any: no daemon
        assert "no daemon running" in assert_clean_error(res.exit_code, res.stdout, res.stderr)
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize(("flags", "says"), [
    (["--log-file", "/nonexistent-dir/x.log"], "cannot write the daemon log /nonexistent-dir"),
    (["--runtime-file", "/nonexistent-dir/rt.json"], "folder /nonexistent-dir does not exist"),
])
def test_start_names_a_path_it_cannot_use(tmp_path: Path, flags: list[str], says: str,
                                          detach: bool) -> None:
    """In the background or not: the folder is not created, the log not skipped."""
    args = ["start", *(["--detach"] if detach else []), "--port", "0",
            "--db", str(tmp_path / "d.db"), *flags]
    if "--runtime-file" not in flags:
        args += ["--runtime-file", str(tmp_path / "rt.json")]
    res = run_cli(*args)
    line = assert_clean_error(res.returncode, res.stdout, res.stderr)
    assert says in line
    assert not Path("/nonexistent-dir").exists()


def test_tool_commands_name_a_path_they_cannot_use(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, says in (
            (["model", "tiny", "-o", str(afile / "m")], "cannot create the model directory"),
            (["model", "tiny", "-o", str(tmp_path / "m"), "--hidden", "160"],
             "multiple of 64"),
            (["trace", "gen", "-w", "chain3", "-r", "1", "-o", str(afile / "t.jsonl")],
             "cannot write trace"),
            (["console", "--db", str(afile), "--at", "nan"], "--at nan: give a finite time")):
        res = invoke(*args)
        assert says in assert_clean_error(res.exit_code, res.stdout, res.stderr), args


# --------------------------------------------------------------------------
# Inputs refused up front, with the place and the fix (not run, hung on or crashed later)
# --------------------------------------------------------------------------


def write_mix(tmp_path: Path, size_2: int) -> Path:
    """A workload of two workflows sharing agent A (100 tokens in w1)."""
    one = {"agents": {"A": {"prefix_tokens": 100}}, "stages": [{"name": "a", "agent": "A"}]}
    two = {"agents": {"A": {"prefix_tokens": size_2}}, "stages": [{"name": "a", "agent": "A"}]}
    path = tmp_path / "conf.yaml"
    path.write_text(yaml.safe_dump({"name": "mix", "operating_points": [1.0], "workflows": [
        {"name": "w1", **one}, {"name": "w2", **two}]}))
    return path


def test_an_agent_with_two_prefix_sizes_is_refused(tmp_path: Path) -> None:
    res = invoke("replay", "-w", str(write_mix(tmp_path, 15000)), "-n", "10", "-p", "fcfs")
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert "agent 'A' has prefix_tokens 15000 in workflow 'w2' but 100 in workflow 'w1'" in line
    check_runs(replay_json("-w", str(write_mix(tmp_path, 100)), "-n", "10", "-p", "fcfs"),
               ["fcfs"], 10)


def test_a_trace_giving_an_agent_two_sizes_is_refused(trace_file: Path) -> None:
    lines = trace_file.read_text().splitlines(keepends=True)
    other = {"name": "other", "agents": {"P": {"prefix_tokens": 15000}},
             "stages": [{"name": "s", "agent": "P"}]}
    trace_file.write_text("".join([*lines[:2], json.dumps({"type": "workflow", "spec": other})
                                   + "\n", *lines[2:]]))
    res = invoke("replay", str(trace_file), "-p", "fcfs")
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert f"{trace_file}:3: agent 'P' has prefix_tokens 15000 in workflow 'other' but 300 " \
           "in workflow 'clitest' (line 2)" in line


@pytest.mark.parametrize(("args", "says"), [
    (["replay", "-w", "chain3", "-r", "1e-300", "-n", "3", "-p", "fcfs"],
     "beyond the 1e+09 s bound on arrival times"),
    (["trace", "gen", "-w", "chain3", "-r", "1e-320", "-n", "1", "-o", os.devnull],
     "give a --rate of at least 1e-09 task/s"),
])
def test_a_rate_too_small_is_refused_not_a_hang(args: list[str], says: str) -> None:
    proc = run_cli(*args)  # a hang times out and fails
    assert says in assert_clean_error(proc.returncode, proc.stdout, proc.stderr)


# task line 3 (task id 0) -> change, what the message must say
BAD_TASKS = {
    "arrival-1e300": (lambda r: r.update(arrival=1e300), "at most 1e+09 s"),
    "arrival-1e17": (lambda r: r.update(arrival=1e17), "got 1e+17"),
    "wait-1e300": (lambda r: r["stages"]["plan"].insert(0, [10, 5, 1e300]),
                   "tool_wait_s 1e+300 is beyond the 1e+09 s bound"),
    "huge-id": (lambda r: r.update(id=99999999999999999999999), "from -2**63 to 2**63-1"),
    "bool-id": (lambda r: r.update(id=True), "got true"),
    "bool-arrival": (lambda r: r.update(arrival=True), "got true"),
    "bool-round": (lambda r: r["stages"]["plan"].__setitem__(0, [True, 10, 0]),
                   "got [true, 10, 0]"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_bad_task_fields_are_one_clear_line(tmp_path: Path, trace_file: Path, case: str) -> None:
    change, says = BAD_TASKS[case]
    rewrite(trace_file, 3, edit(change))
    proc = run_cli("replay", str(trace_file), "-p", "fcfs", "--db", str(tmp_path / "d.db"))
    line = assert_clean_error(proc.returncode, proc.stdout, proc.stderr)
    assert line.startswith(f"error: {trace_file}:3: ") and says in line, line


def test_a_boolean_version_is_refused(trace_file: Path) -> None:
    rewrite(trace_file, 1, edit(lambda r: r.update(version=True)))
    res = invoke("replay", str(trace_file), "-p", "fcfs")
    assert f"{trace_file}:1: trace version true is not supported" in assert_clean_error(
        res.exit_code, res.stdout, res.stderr)


def test_a_trace_passed_as_workload_is_named(trace_file: Path) -> None:
    res = invoke("replay", "-w", str(trace_file), "-p", "fcfs")
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert line == (f"error: {trace_file}: this looks like a trace (JSON Lines with a header), "
                    f"not a workflow spec; pass it as TRACE_FILE (`topasd replay {trace_file}`), "
                    "not --workload")


def test_a_spec_passed_as_trace_is_named(spec_file: Path) -> None:
    res = invoke("replay", str(spec_file), "-p", "fcfs")
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert line == (f"error: {spec_file}:1: this looks like a workflow spec (YAML or JSON), "
                    f"not a trace; use --workload {spec_file}")


def test_a_trace_with_a_byte_order_mark_replays(trace_file: Path) -> None:
    plain = replay_json(str(trace_file), "-p", "fcfs")["runs"][0]["mean_jct_s"]
    trace_file.write_bytes(b"\xef\xbb\xbf" + trace_file.read_bytes())
    assert replay_json(str(trace_file), "-p", "fcfs")["runs"][0]["mean_jct_s"] == plain


def test_spec_errors_in_a_trace_read_file_line_colon(trace_file: Path) -> None:
    rewrite(trace_file, 2, edit(lambda r: _stage(r, "code").update(rounds=0)))
    res = invoke("replay", str(trace_file), "-p", "fcfs")
    line = assert_clean_error(res.exit_code, res.stdout, res.stderr)
    assert line.startswith(f"error: {trace_file}:2: workflow 'clitest', stage 'code', "
                           "rounds: values must lie in [1, 10000]"), line


def test_the_decision_log_names_the_search_behind_topas_decision_times(tmp_path: Path) -> None:
    """Decision times depend on the search that made them (compiled or pure
    Python): a TOPAS run's row says which; a baseline's has no search."""
    import sqlite3

    db = tmp_path / "d.db"
    res = invoke("replay", "-w", "chain3", "-r", "0.3", "-n", "3", "-p", "topas", "-p", "fcfs",
                 "-q", "--db", str(db))
    assert res.exit_code == 0, res.output
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT policy, params FROM runs").fetchall())
    assert json.loads(rows["topas"])["search"] == "pure Python: TOPASD_NATIVE=0"
    assert "search" not in json.loads(rows["fcfs"])


def test_ctrl_c_in_a_replay_keeps_the_policies_that_finished(tmp_path: Path) -> None:
    """SIGINT during the second policy: the first one's row, the cut run marked
    interrupted in the log, exit 130.

    The signal waits on the replay itself: its stderr is a terminal, so it draws
    a progress bar per policy, and topas's bar showing engine time means topas's
    run has begun (its row exists) with almost all of its 2,000 tasks to go."""
    import pty
    import signal
    import sqlite3

    db = tmp_path / "int.db"
    master, slave = pty.openpty()
    argv = ["topasd", "replay", "-w", "metagpt-tl", "-n", "2000", "-p", "fcfs", "-p", "topas",
            "--db", str(db)]
    # Ctrl-C as a terminal delivers it, also when this suite runs as a background
    # job: such a job starts with SIGINT ignored, and the replay would inherit that
    proc = subprocess.Popen(
        [sys.executable, "-c", "import runpy, signal, sys; "
         "signal.signal(signal.SIGINT, signal.default_int_handler); "
         f"sys.argv = {argv!r}; runpy.run_module('topasd.cli', run_name='__main__')"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    try:
        shown = _read_terminal_until(master, lambda text: "topas" in text and
                                     "engine t=" in text.split("topas", 1)[1])
        proc.send_signal(signal.SIGINT)
        shown += _read_terminal_until(master, None)  # to the replay's exit
        out = proc.communicate(timeout=600)[0]
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 130, shown
    assert "interrupted during topas" in shown and "Traceback" not in shown
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["fcfs"]  # its row only
    assert "run 2 (topas) is marked interrupted" in shown
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT id, policy, status FROM runs ORDER BY id").fetchall()
    assert runs == [(1, "fcfs", "done"), (2, "topas", "interrupted")]


def _read_terminal_until(fd: int, done: Callable[[str], bool] | None,
                         guard_s: float = 600) -> str:
    """What a child writes to the terminal `fd`, until `done(text)`; with `done`
    None, until the child closes it. The guard only stops a hang."""
    import select

    text = ""
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 1.0)[0]:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed its end
            data = b""
        if not data:
            assert done is None, f"the replay ended before the awaited progress: {text[-2000:]!r}"
            return text
        text += data.decode(errors="replace")
        if done is not None and done(text):
            return text
    raise AssertionError(f"no such progress within {guard_s} s: {text[-2000:]!r}")


def test_replay_reads_a_trace_from_standard_input(tmp_path: Path) -> None:
    gen = subprocess.run([sys.executable, "-m", "topasd.cli", "trace", "gen", "-w", "chain3",
                          "-r", "0.3", "-n", "12", "-o", "-"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    args = [sys.executable, "-m", "topasd.cli", "replay", "-", "-p", "fcfs", "--json"]
    piped = subprocess.run(args, input=gen.stdout, capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    (tmp_path / "t.jsonl").write_text(gen.stdout)
    filed = subprocess.run([*args[:4], "t.jsonl", *args[5:]], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    def outcome(out: str) -> list[dict[str, Any]]:  # without the wall-clock fields
        return [{k: v for k, v in run.items() if "ms" not in k and "wall" not in k}
                for run in json.loads(out)["runs"]]

    assert outcome(piped.stdout) == outcome(filed.stdout)
    bad = subprocess.run(args, input='{"type": "header"\n', capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: <stdin>:1: not valid JSON")


def test_a_budget_beyond_any_engine_is_refused(trace_file: Path) -> None:
    """A typo'd --budget (10**12 tokens) would let a typo'd request run for
    ever: it is bounded."""
    res = invoke("replay", str(trace_file), "--budget", str(10**12))
    assert res.exit_code == 2 and "is not in the range 1<=x<=1000000000" in res.output


def test_the_table_header_leaves_out_what_the_trace_does_not_say(tmp_path: Path) -> None:
    """A hand-written trace header without workload or rate: no "workload ?"."""
    path = tmp_path / "bare.jsonl"
    res = invoke("trace", "gen", "-w", "chain3", "-r", "0.3", "-n", "2", "-o", str(path))
    assert res.exit_code == 0, res.output
    _, *rest = path.read_text().splitlines(keepends=True)
    path.write_text('{"type": "header", "format": "topasd-trace", "version": 1}\n'
                    + "".join(rest))
    out = invoke("replay", str(path), "-p", "fcfs", "-q").stdout.splitlines()[0]
    assert out == "2 tasks, profile qwen2.5-32b-a100 (times in s)"
