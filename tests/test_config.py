"""Daemon settings: flag > TOPAS_* environment > topasd.toml > default, each
value's source shown by `topasd start --print-config`, and one-line errors
for bad values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from topasd.cli import main
from topasd.config import ConfigError, load_settings, render

TOML = """
policy = "topas-noaging"
port = 9000
speed = 4
seed = 7
token = "from-file"

[params]
beta = 3
"""


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "topasd.toml"
    cfg.write_text(TOML)
    env = {"TOPAS_PORT": "9100", "TOPAS_SPEED": "max", "TOPAS_PARAMS": "rho=2,M=3"}
    loaded = load_settings({"port": 0, "params": {"beta": 5.5}}, config=str(cfg), environ=env)
    s, src = loaded.settings, loaded.sources
    assert (s.port, src["port"]) == (0, "flag")  # flag over env over file
    assert (s.speed, src["speed"]) == ("max", "env TOPAS_SPEED")  # env over file
    assert (s.seed, src["seed"]) == (7, f"file {cfg}")
    assert (s.profile, src["profile"]) == ("qwen2.5-32b-a100", "default")
    assert s.params == {"beta": 5.5, "rho": 2, "m": 3}  # per key: flag > env > file
    assert src["params"] == "env TOPAS_PARAMS + flag"
    assert not s.paced and s.loopback


def test_print_config_shows_merged_values_and_sources(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "topasd.toml").write_text(TOML)  # found in the working directory
    for k in [k for k in os.environ if k.startswith("TOPAS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("TOPAS_SPEED", "2.5")
    res = CliRunner().invoke(main, ["start", "--port", "0", "--print-config"])
    assert res.exit_code == 0, res.output
    lines = {line.split("=")[0].strip(): line for line in res.output.splitlines() if "=" in line}
    assert lines["port"].split("#")[0].strip() == "port = 0" and lines["port"].endswith("# flag")
    assert "speed = 2.5" in lines["speed"] and lines["speed"].endswith("# env TOPAS_SPEED")
    assert 'policy = "topas-noaging"' in lines["policy"]
    assert lines["policy"].endswith("file topasd.toml")
    assert 'backend = "sim"' in lines["backend"] and lines["backend"].endswith("# default")
    assert 'token = "***"' in lines["token"] and "from-file" not in res.output
    assert "beta = 3" in res.output


def test_the_model_name_defaults_to_the_engines_model_folder() -> None:
    """/v1/models lists `model`: the simulator's name, else the model folder's
    name (a vLLM daemon never calls itself topasd-sim); a given name wins."""
    assert load_settings({}, environ={}).settings.model == "topasd-sim"
    vllm = {"backend": "vllm", "model_path": "/models/tiny-qwen"}
    assert load_settings(vllm, environ={}).settings.model == "tiny-qwen"
    assert load_settings({**vllm, "model": "mine"}, environ={}).settings.model == "mine"


def test_the_token_comes_from_a_file_and_a_token_flag_is_warned_of(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-token-of-sixteen-chars\nignored\n")
    token.chmod(0o600)
    loaded = load_settings({"host": "0.0.0.0", "token_file": str(token)}, environ={})
    assert loaded.settings.token == "a-token-of-sixteen-chars" and loaded.warnings == ()
    assert loaded.sources["token"] == f"token_file {token}"
    assert "a-token-of" not in render(loaded)
    token.chmod(0o644)
    loaded = load_settings({"token_file": str(token)}, environ={})
    assert loaded.warnings == (f"the token file {token} may be read by other users (mode 644); "
                               "chmod 600 it",)
    from_env = load_settings({}, environ={"TOPAS_TOKEN": "t"})
    assert from_env.settings.token == "t" and from_env.warnings == ()
    from_flag = load_settings({"token": "t"}, environ={})
    assert len(from_flag.warnings) == 1 and "other users of this machine see it (`ps`)" in \
        from_flag.warnings[0] and "--token-file FILE or TOPAS_TOKEN" in from_flag.warnings[0]


def test_render_masks_the_token_and_lists_params() -> None:
    loaded = load_settings({"token": "secret", "params": {"H_age": 30, "K": 4}}, environ={})
    text = render(loaded)
    assert "secret" not in text and 'token = "***"' in text
    assert "h_age = 30" in text and "k = 4" in text


@pytest.mark.parametrize(("flags", "env", "words"), [
    ({"speed": "fast"}, {}, ["setting speed = 'fast' (from flag)", "'max'"]),
    ({}, {"TOPAS_SPEED": "0"}, ["setting speed = '0' (from env TOPAS_SPEED)"]),
    ({"port": 70000}, {}, ["setting port = 70000", "65535"]),
    ({"grace": float("inf")}, {}, ["setting grace = inf", "finite"]),
    ({}, {"TOPAS_TASK_TIMEOUT": "nan"}, ["task_timeout", "finite"]),
    ({"workload": "chain3", "rate": float("nan")}, {}, ["setting rate = nan", "finite"]),
    ({"workload": "nope"}, {}, ["setting workload = 'nope' (from flag)", "unknown workload"]),
    ({}, {"TOPAS_WORKLOAD": "x.yaml"}, ["setting workload = 'x.yaml' (from env TOPAS_WORKLOAD)",
                                        "does not exist"]),
    ({"workflows": ["/nowhere/w.yaml"]}, {}, ["setting workflows = '/nowhere/w.yaml'",
                                              "cannot read"]),
    ({"profile": "h100"}, {}, ["unknown hardware profile", "small"]),
    # a seed numpy refuses, or one the decision log cannot hold, is refused
    ({}, {"TOPAS_SEED": "-3"}, ["setting seed = '-3' (from env TOPAS_SEED)", "0"]),
    ({"seed": 2**63}, {}, ["setting seed = 9223372036854775808", "9223372036854775807"]),
    ({"policy": "magic"}, {}, ["unknown policy", "topas"]),
    ({"params": {"beta": -1}}, {}, ["beta=-1 is out of range", "[0.0, 1000.0]"]),
    ({"params": {"zeta": 1}}, {}, ["unknown TOPAS parameter(s) ['zeta']"]),
    ({"policy": "fcfs", "params": {"beta": 1}}, {}, ["takes no parameters"]),
    ({"host": "0.0.0.0"}, {}, ["not a loopback address", "token"]),
    # off loopback a token must not be guessable in a few tries
    ({"host": "0.0.0.0", "token": "x"}, {}, ["1 characters is too short", "at least 16",
                                            "secrets.token_urlsafe"]),
    ({"token_file": "/nowhere/token"}, {}, ["setting token_file = '/nowhere/token' (from flag)",
                                            "cannot read it (No such file or directory)"]),
    ({"token_file": "/dev/null"}, {}, ["first line is empty"]),
    ({"token_file": "/dev/null"}, {"TOPAS_TOKEN": "t"}, ["a token is also given (from env "
                                                         "TOPAS_TOKEN); give one of them"]),
    # one parameter under both its names is an error, not the last one winning
    ({"params": {"H_age": 30, "h_age": 40}}, {}, ["H_age and h_age name the same parameter"]),
    ({}, {"TOPAS_PARAMS": "M=3,m=4"}, ["(from env TOPAS_PARAMS)", "M and m name the same"]),
    # an HTTP header carries the token: a non-ASCII one could never authenticate
    ({"token": "pässwörd"}, {}, ["setting token = '***'", "printable ASCII"]),
    ({"token": "two words"}, {}, ["printable ASCII without spaces"]),
    # SGLang's options on another backend were taken without a word
    ({"tp_size": 2}, {}, ["setting tp_size (from flag) is for --backend sglang, not sim"]),
    ({}, {"TOPAS_HICACHE": "true"}, ["setting hicache (from env TOPAS_HICACHE)", "sglang"]),
    ({"tasks": 5}, {}, ["tasks needs a workload"]),
    ({"rate": 0.5}, {}, ["setting rate needs a workload"]),
    # a real engine cannot be sped up: the speed would be taken and then ignored
    ({"backend": "vllm", "model_path": "/m", "speed": 2}, {},
     ["setting speed (from flag)", "vllm engine runs in real time", "--speed is for"]),
    ({"backend": "sglang", "model_path": "/m"}, {"TOPAS_SPEED": "max"},
     ["(from env TOPAS_SPEED)", "sglang engine runs in real time"]),
    ({"log_candidates": "some"}, {}, ["top:N"]),
    ({}, {"TOPAS_PARAMS": "{oops"}, ["TOPAS_PARAMS: not valid JSON"]),
    # a misspelled variable was ignored without a word
    ({}, {"TOPAS_POLCY": "lpm"}, ["TOPAS_POLCY names no setting", "did you mean TOPAS_POLICY?"]),
    ({}, {"TOPAS_XYZZY": "1"}, ["TOPAS_XYZZY names no setting: unset it", "TOPAS_SPEED"]),
])
def test_bad_settings_are_one_clear_error(flags: dict, env: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags, environ=env)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_localhost_is_loopback_and_needs_no_token() -> None:
    settings = load_settings({"host": "localhost"}, environ={}).settings
    assert settings.loopback and settings.token is None
    assert not load_settings({"host": "::1"}, environ={}).settings.token
    assert load_settings({"host": "localhost", "token": "t"}, environ={}).settings.loopback


def test_bad_config_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({}, config=str(bad), environ={})
    bad.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['prot'\]"):
        load_settings({}, config=str(bad), environ={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings({}, config=str(tmp_path / "missing.toml"), environ={})


def test_two_workflows_may_not_share_a_name(tmp_path: Path) -> None:
    """A spec named like a built-in workflow, the --workload's or another spec
    is refused: every task and call runs the workflow its name names (a later
    one replacing a built-in would run a built-in workload's tasks on the
    wrong stages)."""
    spec = ("name: {name}\nagents: {{P: {{prefix_tokens: 100}}}}\n"
            "stages:\n  - {{name: plan, agent: P, input_tokens: 10, output_tokens: 10}}\n")
    for name in ("chain3", "mine"):
        for copy in ("1", "2"):
            (tmp_path / f"{name}{copy}.yaml").write_text(spec.format(name=name))
    clashes = [
        ({"workload": "chain3", "workflows": [str(tmp_path / "chain31.yaml")]},
         "'chain3' is taken by the built-in workload 'chain3'"),
        ({"workflows": [str(tmp_path / "chain31.yaml")]}, "the built-in workload 'chain3'"),
        ({"workflows": [str(tmp_path / "mine1.yaml"), str(tmp_path / "mine2.yaml")]},
         f"'mine' is taken by the workflow spec '{tmp_path / 'mine1.yaml'}'"),
        ({"workload": str(tmp_path / "mine1.yaml"), "workflows": [str(tmp_path / "mine2.yaml")]},
         f"'mine' is taken by the workload '{tmp_path / 'mine1.yaml'}'"),
    ]
    for flags, words in clashes:
        with pytest.raises(ConfigError, match="rename it") as err:
            load_settings(flags, environ={})
        assert words in str(err.value), str(err.value)
    fine = load_settings({"workload": "chain3", "workflows": [str(tmp_path / "mine1.yaml")]},
                         environ={})
    assert fine.settings.workflows == [str(tmp_path / "mine1.yaml")]


def test_cli_start_reports_bad_input_in_one_line(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["start", "--speed", "fast"], ["start", "--param", "beta"],
                 ["start", "--param", "beta=2000"], ["start", "--host", "10.1.2.3"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert not (tmp_path / "topasd.db").exists()  # nothing started


def test_a_parameter_may_not_undo_what_defines_an_ablation_variant() -> None:
    """topas-base with reuse=true would run full TOPAS's reuse under the name of
    the variant without it: refused at start, at replay and when tuned live;
    restating the variant's own value is fine."""
    from topasd.model import TopasError
    from topasd.scheduler import build_policy

    with pytest.raises(TopasError, match=r"topas-base runs with reuse=False; reuse=True"):
        build_policy("topas-base", {"reuse": True})
    assert build_policy("topas-base", {"reuse": False, "beta": 3}).params.beta == 3
    live = build_policy("topas-noaging", {})
    with pytest.raises(TopasError, match="topas-noaging runs with aging=False"):
        live.set_params(aging=True)
    assert live.params.aging is False
    # nor turn the other switch off: topas-noaging without reuse is topas-base
    with pytest.raises(TopasError, match="topas-noaging with reuse=False would run as "
                                         "topas-base: choose that policy"):
        live.set_params(reuse=False)
    assert live.params.reuse is True
    with pytest.raises(TopasError, match="topas-noreuse with aging=False would run as "
                                         "topas-base"):
        build_policy("topas-noreuse", {"aging": False})
    assert build_policy("topas", {"reuse": False}).params.reuse is False  # topas takes any
    result = CliRunner().invoke(main, ["replay", "-w", "chain3", "-n", "3", "-p", "topas-base",
                                       "--param", "reuse=true"])
    assert result.exit_code == 2 and "would make it another variant" in result.output


def test_an_engine_backend_that_is_not_installed_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backend sglang` without SGLang is one line naming the extra to install,
    not a traceback ending in "No module named 'zmq'"."""
    import importlib.util

    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("sglang", "zmq") else real(name, *a))
    res = CliRunner().invoke(main, ["start", "--port", "0", "--backend", "sglang",
                                    "--model-path", "Qwen/Qwen2.5-7B-Instruct"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the SGLang backend needs"), res.output
    assert "pip install -e '.[sglang]'" in lines[0] and "sglang, zmq" in lines[0]
