"""Settings: one precedence (CLI > env > ini > profile default > default) and one-line errors."""

from __future__ import annotations

import dataclasses
import shlex
import types
import typing

import pytest

from pytest_apc import config as apc_config
from pytest_apc.report import reference


def resolve(pytester: pytest.Pytester, *args: str, ini: str = "", env: dict[str, str] | None = None):
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    cfg = pytester.parseconfig(*args)
    return apc_config.resolve(cfg, environ=env or {})


def test_defaults_without_profile(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester)
    assert settings.enabled is False
    assert settings.num_prompts == 30
    assert settings.concurrency == 8
    assert settings.sweep_concurrency == (1, 2, 4, 8)
    assert settings.length_scale == 1.0
    assert settings.sources["num_prompts"] == "default"


def test_cpu_profile_scales_lengths(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester, "--cpu-node")
    assert settings.profile == "cpu"
    assert settings.scaled(32768) == 2048
    assert settings.scaled(1024) == 64
    assert settings.sources["length_scale"] == "cpu profile default"


def test_precedence_cli_over_env_over_ini(pytester: pytest.Pytester) -> None:
    ini = "apc_set = num_prompts=11"
    env = {"PYTEST_APC_SET": "num_prompts=12"}
    assert resolve(pytester, ini=ini).num_prompts == 11
    assert resolve(pytester, ini=ini, env=env).num_prompts == 12
    settings = resolve(pytester, "--apc-set=num_prompts=13", ini=ini, env=env)
    assert settings.num_prompts == 13
    assert settings.sources["num_prompts"] == "option --apc-set"


def test_env_overrides_profile_default(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester, "--cpu-node", env={"PYTEST_APC_LENGTH_SCALE": "0.5"})
    assert settings.length_scale == 0.5
    assert settings.sources["length_scale"] == "environment variable PYTEST_APC_LENGTH_SCALE"


def test_profile_from_ini(pytester: pytest.Pytester) -> None:
    assert resolve(pytester, ini="apc_profile = cpu").profile == "cpu"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--apc-set=num_prompts=0"], {}, "Invalid apc_num_prompts '0' from option --apc-set: must be a positive"),
        ([], {"PYTEST_APC_SET": "concurrency=-1"}, "Invalid apc_concurrency '-1' from environment variable"),
        (["--apc-set=sweep_concurrency=1,1"], {}, "must not repeat a value"),
        (["--apc-hash-algos=md5"], {}, "unknown hash algorithm 'md5'"),
        (["--apc-profile=tpu"], {}, "Invalid apc_profile 'tpu'"),
        (["--apc-length-scale=2"], {}, "must be in (0, 1]"),
        (["--apc-length-scale=0"], {}, "must be in (0, 1]"),
        (["--apc-set=min_bound_fraction=1.5"], {}, "must be in [0, 1]"),
        (["--apc-set=startup_timeout=0"], {}, "must be > 0"),
        (["--apc-set=startup_timeout=nan"], {}, "must be > 0"),
        (["--apc-set=seed=-1"], {}, "Invalid apc_seed '-1' from option --apc-set: must be >= 0"),
        (["--apc-set=sweep_concurrency=1,0"], {}, "must be a positive integer"),
    ],
)
def test_invalid_values_name_setting_and_source(pytester: pytest.Pytester, args, env, message) -> None:
    with pytest.raises(apc_config.SettingError) as err:
        resolve(pytester, *args, env=env)
    assert message in str(err.value)


def test_invalid_ini_names_the_ini_key(pytester: pytest.Pytester) -> None:
    with pytest.raises(apc_config.SettingError, match=r"Invalid apc_output_len 'x' from ini key apc_set"):
        resolve(pytester, ini="apc_set = output_len=x")


def test_gpu_node_needs_a_model(pytester: pytest.Pytester) -> None:
    with pytest.raises(apc_config.SettingError, match=r"No model for --gpu-node.*MODEL_70B"):
        resolve(pytester, "--gpu-node")
    settings = resolve(pytester, "--gpu-node", env={"MODEL_70B": "/models/llama-70b"})
    assert settings.model == "/models/llama-70b"
    assert settings.sources["model"] == "environment variable MODEL_70B"
    assert resolve(pytester, "--gpu-node", "--apc-model=/m", env={"MODEL_70B": "/x"}).model == "/m"


@pytest.mark.parametrize(
    "external",
    [("--apc-url-on=http://on:8000", "--apc-url-off=http://off:8000"),
     ("--apc-fleet-url=http://gw:80", "--apc-metrics-url=http://r1:8000", "--apc-metrics-url=http://r2:8000")],
)  # fmt: skip
def test_gpu_node_measuring_servers_run_elsewhere_needs_only_a_tokenizer(pytester: pytest.Pytester, external) -> None:
    settings = resolve(pytester, "--gpu-node", "--apc-tokenizer=meta-llama/Llama-3.1-8B-Instruct", *external, env={})
    assert (settings.model, settings.tokenizer) == ("", "meta-llama/Llama-3.1-8B-Instruct")
    assert settings.model_label == "served elsewhere (tokenizer Llama-3.1-8B-Instruct)"
    # Launching needs a model: a tokenizer with one external server, or none at all, is not enough.
    for args in (("--apc-tokenizer=/tok", "--apc-url-on=http://on:8000"), external):
        with pytest.raises(
            apc_config.SettingError, match=r"launching servers needs --apc-model .* needs only --apc-tok"
        ):
            resolve(pytester, "--gpu-node", *args, env={})


def test_the_replica_key_and_the_ca_bundle(pytester: pytest.Pytester, tmp_path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = resolve(pytester, f"--apc-set=ca_bundle={bundle}", env={"PYTEST_APC_SET": "replica_api_key=k2"})
    assert (settings.replica_api_key, settings.ca_bundle) == ("k2", str(bundle))
    with pytest.raises(apc_config.SettingError, match=r"Invalid apc_ca_bundle '/nonexistent.pem' .*: no such file"):
        resolve(pytester, "--apc-set=ca_bundle=/nonexistent.pem", env={})


def test_server_args_repeatable_and_shell_quoted(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester, "--apc-server-arg=--max-num-seqs", "--apc-server-arg=16")
    assert settings.server_arg == ("--max-num-seqs", "16")
    settings = resolve(pytester, env={"PYTEST_APC_SERVER_ARG": "--gpu-memory-utilization 0.8 --name 'a b'"})
    assert settings.server_arg == ("--gpu-memory-utilization", "0.8", "--name", "a b")
    settings = resolve(pytester, ini="apc_server_arg = --enforce-eager --block-size 32")
    assert settings.server_arg == ("--enforce-eager", "--block-size", "32")


def test_every_setting_has_option_ini_and_env() -> None:
    for spec in apc_config.SPECS:
        assert spec.option == "--apc-" + spec.name.replace("_", "-")
        assert spec.ini == "apc_" + spec.name
        assert spec.env == "PYTEST_APC_" + spec.name.upper()
        assert spec.help
        assert spec.help[0].isupper()


def test_number_validator_bounds() -> None:
    fraction_or_zero = apc_config.number(float, low=0, high=1)
    assert fraction_or_zero("0") == 0.0
    assert fraction_or_zero("1") == 1.0
    assert apc_config.number(int, low=0)("0") == 0
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        apc_config.number(float, low=0, low_open=True, high=1)("0")
    with pytest.raises(ValueError, match=r"^must be a positive integer$"):
        apc_config.number(int, low=1)("1.5")
    with pytest.raises(ValueError, match=r"^must be an integer >= 2$"):
        apc_config.number(int, low=2)("x")
    with pytest.raises(ValueError, match=r"^must be a number in \(0, 1\]$"):
        apc_config.number(float, low=0, low_open=True, high=1)("half")


BAD_VALUES = ("x", "1.5", "-1", "1,x", "'unclosed", "a\\")


def _python_errors(text: str) -> list[str]:
    """What Python itself says of ``text`` as an int, a float and a shell line (none of it may leak)."""
    said = []
    for parse in (int, float, shlex.split):
        try:
            parse(text)
        except ValueError as err:
            said.append(str(err))
    return said


def _in_environment(spec: apc_config.Spec, value: str) -> tuple[dict[str, str], str]:
    """The environment that gives ``spec`` the text ``value``, and the variable that holds it."""
    if spec.advanced:
        return {"PYTEST_APC_SET": shlex.quote(f"{spec.name}={value}")}, "PYTEST_APC_SET"
    return {spec.env: value}, spec.env


@pytest.mark.parametrize("bad", BAD_VALUES)
def test_every_invalid_value_is_said_in_words_not_in_pythons(pytester: pytest.Pytester, bad: str) -> None:
    """Whatever a setting refuses, the message says what it wants (e.g. "must be a positive integer"), never
    Python's "invalid literal for int() with base 10: 'x'" or shlex's "No closing quotation"."""
    config = pytester.parseconfig()
    leaks = _python_errors(bad)
    said = {}
    for spec in apc_config.SPECS:
        env, where = _in_environment(spec, bad)
        try:
            apc_config.resolve(config, environ=env)
        except apc_config.SettingError as err:
            said[spec.name] = str(err).partition(f"from environment variable {where}: ")[2]
    assert said  # the numbers refuse every one of these
    assert all(said.values()), said  # each message names the value's source
    leaked = {name: reason for name, reason in said.items() if any(leak in reason for leak in leaks)}
    assert not leaked


def test_a_list_setting_says_so_in_its_metavar(pytester: pytest.Pytester) -> None:
    """A setting that takes a list of any length shows it (N,N,...): --apc-set offload_concurrency=1,2,3 is one."""
    lists = [spec for spec in apc_config.SPECS if isinstance(spec.default, tuple) and spec.metavar != "CMD"]
    assert {spec.name for spec in lists if not spec.repeatable} >= {"sweep_concurrency", "offload_concurrency"}
    for spec in lists:
        if not spec.repeatable:
            assert spec.metavar.endswith(",..."), spec.name
    assert resolve(pytester, "--apc-set=offload_concurrency=1,2,3").offload_concurrency == (1, 2, 3)


def test_connect_host_defaults_to_the_bind_address(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester)
    assert settings.connect_host == settings.host == "127.0.0.1"
    assert settings.sources["connect_host"] == "derived from apc_host"
    assert resolve(pytester, "--apc-set=host=10.0.0.5").connect_host == "10.0.0.5"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_connect_host_for_a_wildcard_bind_is_loopback(pytester: pytest.Pytester, wildcard: str) -> None:
    settings = resolve(pytester, env={"PYTEST_APC_SET": f"host={wildcard}"})
    assert settings.host == wildcard
    assert settings.connect_host == "127.0.0.1"


def test_explicit_connect_host_wins(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester, "--apc-set=host=0.0.0.0", ini="apc_set = connect_host=node7.cluster")
    assert settings.connect_host == "node7.cluster"
    assert settings.sources["connect_host"] == "ini key apc_set"


def _mentions_any(hint: object) -> bool:
    return hint is typing.Any or any(_mentions_any(arg) for arg in typing.get_args(hint))


def _conforms(value: object, hint: object) -> bool:
    """A shallow isinstance check of a declared default against the field's annotation."""
    if isinstance(hint, types.UnionType):
        return any(_conforms(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    return isinstance(value, origin) and not (origin is int and isinstance(value, bool))  # type: ignore[arg-type]


def test_settings_fields_and_specs_agree_and_are_typed() -> None:
    hints = typing.get_type_hints(apc_config.Settings)
    names = [f.name for f in dataclasses.fields(apc_config.Settings) if f.name != "sources"]
    assert names == [spec.name for spec in apc_config.SPECS]
    assert list(apc_config.setting_names()) == names
    for spec in apc_config.SPECS:
        hint = hints[spec.name]
        assert not _mentions_any(hint), spec.name
        for value in (spec.default, spec.gpu, spec.cpu):
            if value is not None or spec is apc_config.SPEC_BY_NAME["profile"]:
                assert _conforms(value, hint), (spec.name, value, hint)
    assert hints["sources"] == dict[str, str]


def test_as_dict_lists_every_setting_in_order(pytester: pytest.Pytester) -> None:
    settings = resolve(pytester, "--cpu-node")
    values = settings.as_dict()
    assert list(values) == [spec.name for spec in apc_config.SPECS]
    assert values["num_prompts"] == settings.num_prompts
    assert "sources" not in values
    assert not hasattr(settings, "values")


def test_a_baseline_takes_the_repeats_its_gate_needs(pytester: pytest.Pytester) -> None:
    assert resolve(pytester, "--cpu-node").repeats == 1
    gated = resolve(pytester, "--cpu-node", "--apc-baseline=b.json")
    assert (gated.repeats, gated.sources["repeats"]) == (3, "derived from apc_baseline_repeats (a baseline is given)")
    assert (
        resolve(pytester, "--cpu-node", "--apc-baseline=b.json", env={"PYTEST_APC_SET": "baseline_repeats=5"}).repeats
        == 5
    )
    more = resolve(pytester, "--cpu-node", "--apc-baseline=b.json", "--apc-repeats=4")
    assert (more.repeats, more.sources["repeats"]) == (4, "option --apc-repeats")


def test_fewer_repeats_than_the_gate_needs_is_a_usage_error(pytester: pytest.Pytester) -> None:
    with pytest.raises(apc_config.SettingError) as err:
        resolve(pytester, "--cpu-node", "--apc-baseline=b.json", "--apc-repeats=1")
    assert str(err.value) == (
        "Invalid apc_repeats 1 from option --apc-repeats: the baseline gate judges runs of apc_baseline_repeats 3 "
        "cold repeats or more (lower apc_baseline_repeats to gate on fewer, at a wider limit)"
    )
    assert resolve(pytester, "--cpu-node", "--apc-baseline=b.json", "--apc-repeats=1", "--apc-set=baseline_repeats=1")


def test_help_shows_each_default_and_where_a_profile_differs(pytester: pytest.Pytester) -> None:
    """``pytest-apc settings`` shows every setting's default, derived from its one declaration, and the
    profile's where it differs (the timeouts of --cpu-node, say); ``pytest --help`` each option's brief with it."""
    spec = apc_config.SPEC_BY_NAME
    assert spec["startup_timeout"].defaults == "Default: 1800.0 (--cpu-node: 600.0)"
    assert spec["sweep_concurrency"].defaults == "Default: 1,2,4,8"
    assert spec["server_command"].defaults == "Default: {python} -m vllm.entrypoints.openai.api_server"
    assert spec["model"].defaults == ""  # its help says in words what applies
    text = "".join(reference.settings_text().split())  # wrapped lines
    for one in apc_config.SPECS:
        assert "".join(f"{one.given_as} {one.described}".split()) in text, one.name
    assert "Default:1800.0(--cpu-node:600.0)" in text
    help_text = "".join(pytester.runpytest("--help").stdout.str().split())  # argparse wraps lines anywhere
    for one in apc_config.SPECS:
        if not one.advanced:
            assert "".join(one.brief_described.split()) in help_text, one.name


def test_a_default_shown_is_what_one_would_give(pytester: pytest.Pytester) -> None:
    """Given as shown (in --help and docs/configuration.md), each default resolves to itself."""
    config = pytester.parseconfig()
    for spec in apc_config.SPECS:
        for profile in ("", "cpu", "gpu"):
            value = spec.default if not profile else getattr(spec, profile)
            if not spec.shown(value) or spec.name == "profile":
                continue
            env = {**_in_environment(spec, spec.shown(value))[0], "PYTEST_APC_PROFILE": profile, "MODEL_70B": "/m"}
            assert getattr(apc_config.resolve(config, environ=env), spec.name) == value, (spec.name, profile)


def _plugin_help(text: str) -> list[str]:
    """The plugin's part of ``pytest --help``: its option group, and its ini keys with their wrapped help."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("vLLM automatic prefix caching"))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    part = lines[start:end]
    in_key = False
    for line in lines[end:]:
        if line.startswith("  ") and not line.startswith("   "):  # an ini key's first line
            in_key = line.startswith("  apc_")
        elif not line.startswith("   "):
            in_key = False
        if in_key:
            part.append(line)
    return part


def test_the_plugins_help_is_short_and_lists_the_markers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most 150 lines of ``pytest --help`` on an 80-column terminal, options and ini keys together: the
    options a user needs, examples, the markers; every other setting is ``pytest-apc settings``'s."""
    monkeypatch.setenv("COLUMNS", "80")
    part = _plugin_help(pytester.runpytest("--help").stdout.str())
    assert len(part) <= 150, "\n".join(part)
    text = " ".join(" ".join(part).split())
    assert "markers (-m): apc (overhead, pure, rag, sweep, hash_algo); fleet, offload, multiturn" in text
    assert "pytest-apc -m apc --cpu-node" in text
    assert "--apc-set=NAME=VALUE" in text
    assert "pytest-apc settings" in text
    assert "apc_set (linelist)" in text
    main = [spec for spec in apc_config.SPECS if not spec.advanced]
    assert len(main) <= 20  # the settings a user must know
    for spec in apc_config.SPECS:
        assert (spec.option in text) is not spec.advanced, spec.name  # an advanced one's old option is hidden
        assert (f"{spec.ini} (" in text) is not spec.advanced, spec.name


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("option", "--apc-confidence was renamed: use --apc-set confidence=0.9"),
        ("env", "PYTEST_APC_CONFIDENCE was renamed: use PYTEST_APC_SET=confidence=0.9"),
        ("ini", "ini key apc_confidence was renamed: use the line confidence=0.9 in apc_set"),
    ],
)
def test_an_old_name_is_one_line_with_the_new_spelling(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str, message: str
) -> None:
    """A setting given by its name before the rename stops pytest (usage error, 4) with one line that spells
    it anew; an old ini key gets no "unknown config option" warning besides."""
    pytester.makepyfile("def test_plain():\n    pass\n")
    args = ["--apc-confidence=0.9"] if how == "option" else []
    if how == "env":
        monkeypatch.setenv("PYTEST_APC_CONFIDENCE", "0.9")
    if how == "ini":
        pytester.makeini("[pytest]\napc_confidence = 0.9\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in result.stderr.lines if line.strip()] == [f"ERROR: {message}"]
    assert "Unknown config option" not in result.stdout.str()


def test_settings_by_name_from_every_source(pytester: pytest.Pytester) -> None:
    """--apc-set, PYTEST_APC_SET and apc_set, one precedence per setting; a list setting given twice on the
    command line collects both, a shell-quoted value keeps its spaces."""
    pytester.makeini("[pytest]\napc_set =\n    seed=3\n    # a comment\n    concurrency=4\n")
    env = {"PYTEST_APC_SET": "concurrency=5 'router_command=vllm-router --x 1'"}
    settings = apc_config.resolve(pytester.parseconfig("--apc-set", "seed=7", "--apc-set=router_arg=--a",
                                                       "--apc-set", "router_arg=b c"), environ=env)  # fmt: skip
    assert (settings.seed, settings.sources["seed"]) == (7, "option --apc-set")
    assert (settings.concurrency, settings.sources["concurrency"]) == (5, "environment variable PYTEST_APC_SET")
    assert settings.router_command == ("vllm-router", "--x", "1")
    assert settings.router_arg == ("--a", "b c")
    ini_only = apc_config.resolve(pytester.parseconfig(), environ={})
    assert (ini_only.seed, ini_only.concurrency, ini_only.sources["seed"]) == (3, 4, "ini key apc_set")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("confidnce=0.9", "option --apc-set: unknown setting 'confidnce'; close: confidence"),
        ("model=/m", "option --apc-set: unknown setting 'model': it is an option of its own, --apc-model"),
        ("zzz=1", "option --apc-set: unknown setting 'zzz'; pytest-apc settings lists them"),
        ("confidence", "option --apc-set: 'confidence' is not NAME=VALUE"),
    ],
)
def test_an_unknown_name_is_one_line_with_the_close_ones(pytester: pytest.Pytester, given: str, message: str) -> None:
    with pytest.raises(apc_config.SettingError) as err:
        resolve(pytester, f"--apc-set={given}")
    assert str(err.value) == message


def test_off_is_0_and_every_level_is_all(pytester: pytest.Pytester) -> None:
    """Every "concurrency up to which a gain must hold" setting: 0 at no level, all at every level; the
    profiles' own (GPU: C/D at every level; CPU: C/D at every level, the rest at none), and -1, which meant "at no
    level" for pure_gain_concurrency, says what to give instead."""
    names = ("low_concurrency", "pure_gain_concurrency", "multiturn_gain_concurrency")
    gpu = resolve(pytester, "--gpu-node", "--apc-model=/m")
    cpu = resolve(pytester, "--cpu-node")
    assert [getattr(gpu, name) for name in names] == [1, "all", 8]
    assert [getattr(cpu, name) for name in names] == [0, "all", 0]
    for name in names:
        assert getattr(resolve(pytester, f"--apc-set={name}=all"), name) == "all"
        for concurrency in (1, 8, 64):
            assert apc_config.gain_required("all", concurrency)
            assert not apc_config.gain_required(0, concurrency)
        assert apc_config.gain_required(4, 4)
        assert not apc_config.gain_required(4, 8)
        with pytest.raises(apc_config.SettingError) as err:
            resolve(pytester, f"--apc-set={name}=-1")
        assert str(err.value) == (
            f"Invalid apc_{name} '-1' from option --apc-set: -1 no longer means no level: 0 is no level, all is "
            "every level"
        )


def test_pytest_apc_settings_lists_every_setting_by_group(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_apc.__main__ import main

    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == list(apc_config.GROUPS.values())
    for spec in apc_config.SPECS:
        assert f"\n  {spec.given_as}\n" in out, spec.name
    thresholds = out.split(apc_config.GROUPS["thresholds"])[1].split(apc_config.GROUPS["workload"])[0]
    for name in ("confidence", "bootstrap_samples", "overhead_tolerance", "low_concurrency", "pure_gain_concurrency",
                 "min_bound_fraction", "baseline_false_alarm", "answers_top_k", "max_routing_cost",
                 "multiturn_gain_concurrency"):  # fmt: skip
        assert f"--apc-set {name}=" in thresholds, name
    assert "Default: 0.1 (--cpu-node: 0.02)" in " ".join(thresholds.split())
