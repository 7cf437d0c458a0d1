"""The node config: DESIGN §2 keys and defaults, and errors that name key, value and what is allowed."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.config import (
    CONFIG_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    ContainersConfig,
    PythonInterpreter,
    SimulatedGpu,
    config_from_dict,
    load_config,
    parse_address,
    resolve_config_path,
)


def problems_of(d: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(d)
    return info.value.problems


def only_problem(d: dict) -> str:
    problems = problems_of(d)
    assert len(problems) == 1, problems
    return problems[0]


def write(tmp_path: Path, text: str, name: str = "mtgpu.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- defaults


def test_defaults_match_the_design():
    c = config_from_dict({})
    assert c.CLUSTER_MODE == "standalone" and c.CLUSTER_ID is None
    assert c.NODE_NAME == socket.gethostname()
    assert c.LISTEN == "0.0.0.0:7070" and c.listen_host_port() == ("0.0.0.0", 7070)
    assert c.PEERS == []
    assert c.STATE_DIR == Path("/var/lib/mtgpu")
    assert c.CLUSTER_SECRET_FILE == Path("/var/lib/mtgpu/cluster.secret") == c.secret_file_path
    assert c.socket_path == Path("/var/lib/mtgpu/mtgpu.sock")
    assert c.TENANT_HOME_ROOT == Path("/home/mtgpu")
    assert c.HOME_LAYOUT == "per-node"
    assert c.DATASETS_DIRECTORIES == [] and c.PYTHON_INTERPRETERS == []
    assert c.USER_DISK_LIMIT is None and c.user_disk_limit_bytes is None
    assert c.JOB_RETENTION_DAYS == 30 and c.TENANT_RETENTION_DAYS == 180
    assert c.JOB_REQUEUE is True  # Slurm's JobRequeue=1
    assert c.job_retention_s == 30 * 86400
    assert c.PERSISTENT_TERMINALS == "on"
    assert c.GPU_BACKEND == "auto"
    assert c.SSH_LISTEN == "0.0.0.0:2222" and c.ssh_listen_host_port() == ("0.0.0.0", 2222)
    assert c.TENANT_UID_RANGE == (200000, 299999)
    assert c.CONTAINERS.enabled is False and c.CONTAINERS.network == "slirp4netns"
    assert c.CONTAINERS.publish_ports is True and c.CONTAINERS.allow_user_images is False
    assert c.CONTAINERS.templates == {} and c.CONTAINERS.images == [] and c.CONTAINERS.cache_volume == "mtgpu-cache"
    assert c.SIMULATED_GPUS == []
    assert c.ADMIN_GROUP == "mtgpu-admin"


def test_every_field_has_a_description():
    for model in (Config, ContainersConfig, SimulatedGpu, PythonInterpreter):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_secret_file_follows_state_dir_unless_given():
    assert config_from_dict({"STATE_DIR": "/srv/mt"}).secret_file_path == Path("/srv/mt/cluster.secret")
    c = config_from_dict({"STATE_DIR": "/srv/mt", "CLUSTER_SECRET_FILE": "/etc/mtgpu/secret"})
    assert c.secret_file_path == Path("/etc/mtgpu/secret")
    assert c.socket_path == Path("/srv/mt/mtgpu.sock")


def test_full_cluster_config():
    c = config_from_dict(
        {
            "CLUSTER_MODE": "cluster",
            "CLUSTER_ID": "lab-a",
            "NODE_NAME": "gpu-1",
            "LISTEN": "[::]:7070",
            "PEERS": ["gpu-2.lan:7070", "10.0.0.3:7070", "[fe80::1]:7070"],
            "HOME_LAYOUT": "shared",
            "DATASETS_DIRECTORIES": ["/data/imagenet"],
            "USER_DISK_LIMIT": "200GiB",
            "PERSISTENT_TERMINALS": "optional",
            "GPU_BACKEND": "simulated",
            "TENANT_UID_RANGE": [300000, 300999],
            "CONTAINERS": {"enabled": False},
            "SIMULATED_GPUS": [
                {"model": "H200", "vram": "141GiB", "count": 8},
                {"model": "MI300X", "vendor": "amd", "vram": "192GiB", "used_vram": "1G", "utilization": 12.5},
            ],
            "ADMIN_GROUP": "wheel",
        }
    )
    assert c.is_cluster and c.CLUSTER_ID == "lab-a"
    assert c.listen_host_port() == ("::", 7070)
    assert c.peer_host_ports() == [("gpu-2.lan", 7070), ("10.0.0.3", 7070), ("fe80::1", 7070)]
    assert c.USER_DISK_LIMIT == 200 * 1024**3
    assert c.DATASETS_DIRECTORIES == [Path("/data/imagenet")]
    h200, mi300 = c.SIMULATED_GPUS
    assert (h200.vendor, h200.vram_bytes, h200.count, h200.used_vram_bytes) == ("nvidia", 141 * 1024**3, 8, 0)
    assert (mi300.vendor, mi300.used_vram, mi300.utilization) == ("amd", 1024**3, 12.5)


def test_simulated_backend_without_gpus_is_a_cpu_only_node():
    assert config_from_dict({"GPU_BACKEND": "simulated"}).SIMULATED_GPUS == []


def test_persistent_terminals_accepts_toml_booleans():
    assert config_from_dict({"PERSISTENT_TERMINALS": True}).PERSISTENT_TERMINALS == "on"
    assert config_from_dict({"PERSISTENT_TERMINALS": False}).PERSISTENT_TERMINALS == "off"


def test_python_interpreters_as_paths_or_tables():
    c = config_from_dict(
        {"PYTHON_INTERPRETERS": ["/opt/envs/torch", "/opt/py312/bin/python3", {"name": "jax", "path": "/opt/j"}]}
    )
    assert c.PYTHON_INTERPRETERS == [
        PythonInterpreter(name="torch", path=Path("/opt/envs/torch")),
        PythonInterpreter(name="py312", path=Path("/opt/py312/bin/python3")),
        PythonInterpreter(name="jax", path=Path("/opt/j")),
    ]


def test_config_is_immutable():
    c = config_from_dict({})
    with pytest.raises(Exception):
        c.LISTEN = "1.2.3.4:1"  # type: ignore[misc]


# ---------------------------------------------------------------- errors name key, value and what is allowed


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("CLUSTER_MODE", "clutser", '"standalone" or "cluster"'),
        ("HOME_LAYOUT", "pernode", '"shared" or "per-node"'),
        ("PERSISTENT_TERMINALS", "yes", '"on", "optional" or "off"'),
        ("GPU_BACKEND", "cuda", '"auto", "nvml", "amd", "intel" or "simulated"'),
    ],
)
def test_enum_errors(key, value, allowed):
    assert only_problem({key: value}) == f'{key} = "{value}": allowed: {allowed}'


@pytest.mark.parametrize(
    "d, key, value, fragment",
    [
        ({"LISTEN": "0.0.0.0:99999"}, "LISTEN", '"0.0.0.0:99999"', "from 0 to 65535"),
        ({"LISTEN": "nohost"}, "LISTEN", '"nohost"', "host:port"),
        ({"SSH_LISTEN": "::1:22"}, "SSH_LISTEN", '"::1:22"', "brackets"),
        ({"PEERS": ["a:1", "b:0"]}, "PEERS[1]", '"b:0"', "from 1 to 65535"),
        ({"PEERS": "a:1"}, "PEERS", '"a:1"', "must be a list"),
        ({"STATE_DIR": "state"}, "STATE_DIR", '"state"', "absolute path"),
        ({"DATASETS_DIRECTORIES": ["/ok", "rel"]}, "DATASETS_DIRECTORIES[1]", '"rel"', "absolute path"),
        ({"USER_DISK_LIMIT": "lots"}, "USER_DISK_LIMIT", '"lots"', "a size such as"),
        ({"USER_DISK_LIMIT": "0G"}, "USER_DISK_LIMIT", '"0G"', "more than 0"),
        ({"JOB_RETENTION_DAYS": 0}, "JOB_RETENTION_DAYS", "0", "must be more than 0"),
        ({"TENANT_RETENTION_DAYS": -1}, "TENANT_RETENTION_DAYS", "-1", "must be more than 0"),
        ({"JOB_RETENTION_DAYS": "30"}, "JOB_RETENTION_DAYS", '"30"', "must be a number"),
        ({"JOB_REQUEUE": "no"}, "JOB_REQUEUE", '"no"', "true or false"),
        ({"TENANT_UID_RANGE": [5, 10]}, "TENANT_UID_RANGE", "[5, 10]", "1000 <= first <= last"),
        ({"TENANT_UID_RANGE": [300000, 200000]}, "TENANT_UID_RANGE", "[300000, 200000]", "first <= last"),
        ({"TENANT_UID_RANGE": [1]}, "TENANT_UID_RANGE", "[1]", "two whole numbers"),
        ({"NODE_NAME": "bad name"}, "NODE_NAME", '"bad name"', "letters, digits"),
        ({"NODE_NAME": 5}, "NODE_NAME", "5", "string"),
        ({"CONTAINERS": {"publish_ports": "yes"}}, "CONTAINERS.publish_ports", '"yes"', "true or false"),
        ({"CONTAINERS": {"network": ""}}, "CONTAINERS.network", '""', "not a network mode"),
        ({"CONTAINERS": []}, "CONTAINERS", "[]", "must be a table"),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "vendor": "nvdia"}]}, "SIMULATED_GPUS[0].vendor", '"nvdia"',
         '"nvidia", "amd" or "intel"'),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "80G"}, {"model": "b", "vram": "eighty"}]},
         "SIMULATED_GPUS[1].vram", '"eighty"', "a size such as"),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "count": 0}]}, "SIMULATED_GPUS[0].count", "0", "at least 1"),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "count": True}]}, "SIMULATED_GPUS[0].count", "true",
         "whole number"),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "utilization": 101}]}, "SIMULATED_GPUS[0].utilization",
         "101", "at most 100"),
        ({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "used_vram": "2G"}]}, "SIMULATED_GPUS[0].used_vram",
         '"2G"', "at most vram (1G)"),
        ({"PYTHON_INTERPRETERS": [{"path": "rel/env"}]}, "PYTHON_INTERPRETERS[0].path", '"rel/env"', "absolute"),
        ({"PYTHON_INTERPRETERS": ["/a/torch", {"name": "torch", "path": "/b"}]}, "PYTHON_INTERPRETERS", None,
         "both named 'torch'"),
    ],
)
def test_value_errors_name_key_value_and_allowed(d, key, value, fragment):
    problem = only_problem(d)
    prefix = f"{key} = {value}: " if value is not None else f"{key} = "
    assert problem.startswith(prefix), problem
    assert fragment in problem


def test_missing_required_keys():
    assert only_problem({"CLUSTER_MODE": "cluster"}).startswith('CLUSTER_ID: is required when CLUSTER_MODE = "cluster"')
    assert only_problem({"SIMULATED_GPUS": [{"model": "H200"}]}) == "SIMULATED_GPUS[0].vram: is required but missing"


def test_unknown_key_suggests_the_closest_and_lists_allowed():
    problem = only_problem({"GPU_BAKCEND": "auto"})
    assert problem.startswith("unknown key 'GPU_BAKCEND' (did you mean 'GPU_BACKEND'? allowed: CLUSTER_MODE, ")
    assert "ADMIN_GROUP" in problem


def test_lowercase_key_suggests_the_uppercase_one():
    assert "did you mean 'STATE_DIR'?" in only_problem({"state_dir": "/x"})


def test_unknown_nested_keys_are_dotted():
    assert only_problem({"CONTAINERS": {"enabeld": True}}).startswith(
        "unknown key 'CONTAINERS.enabeld' (did you mean 'enabled'? allowed: enabled, templates, "
    )
    assert only_problem({"SIMULATED_GPUS": [{"model": "a", "vram": "1G", "vrm": 1}]}).startswith(
        "unknown key 'SIMULATED_GPUS[0].vrm' (did you mean 'vram'?"
    )


def test_several_problems_are_reported_at_once():
    problems = problems_of(
        {
            "CLUSTER_MODE": "cluster",
            "LISTEN": "x",
            "FOO": 1,
            "SIMULATED_GPUS": [{"model": "H200", "vram": "141G"}, {"model": "A100", "vram": "big"}],
        }
    )
    assert len(problems) == 4
    assert any(p.startswith("CLUSTER_ID:") for p in problems)
    assert any(p.startswith('LISTEN = "x"') for p in problems)
    assert any(p.startswith("unknown key 'FOO'") for p in problems)
    assert any(p.startswith('SIMULATED_GPUS[1].vram = "big"') for p in problems)


def test_error_str_has_one_line_per_problem_with_the_source():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"LISTEN": "x", "FOO": 1}, source="/etc/mtgpu/mtgpu.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and all(line.startswith("/etc/mtgpu/mtgpu.toml: ") for line in lines)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.problems == info.value.problems and str(again) == str(info.value)


def test_non_mapping_is_a_config_error():
    with pytest.raises(ConfigError):
        config_from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0.0.0.0:7070", ("0.0.0.0", 7070)),
        ("[::1]:22", ("::1", 22)),
        ("host-1.example.org:1", ("host-1.example.org", 1)),
    ],
)
def test_parse_address(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", ":80", "host:", "host:x", "[zz]:1", "[::1]", "a b:1", "host:-1"])
def test_parse_address_rejects(text):
    with pytest.raises(ValueError):
        parse_address(text)


# ---------------------------------------------------------------- the file


def test_load_a_toml_file(tmp_path):
    path = write(
        tmp_path,
        'CLUSTER_MODE = "cluster"\nCLUSTER_ID = "lab"\nGPU_BACKEND = "simulated"\n'
        '[CONTAINERS]\nenabled = false\n\n[[SIMULATED_GPUS]]\nmodel = "RTX 4090"\nvram = "24GiB"\ncount = 2\n',
    )
    c = load_config(path, env={})
    assert c.CLUSTER_ID == "lab" and not c.CONTAINERS.enabled
    assert c.SIMULATED_GPUS[0].count == 2 and c.SIMULATED_GPUS[0].vram == 24 * 1024**3


def test_toml_syntax_error_gives_line_and_column(tmp_path):
    path = write(tmp_path, 'LISTEN = "0.0.0.0:7070"\nPEERS = [\n  "a:1"\n  "b:2"\n]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    err = info.value
    assert err.line == 4 and err.column is not None
    assert len(err.problems) == 1
    assert str(err).startswith(f"{path}: line 4, column {err.column}: TOML syntax error: ")


def test_validation_errors_carry_the_file_path(tmp_path):
    path = write(tmp_path, 'GPU_BACKEND = "cuda"\n')
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert str(info.value) == f'{path}: GPU_BACKEND = "cuda": allowed: "auto", "nvml", "amd", "intel" or "simulated"'


def test_non_utf8_file_is_a_config_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b'NODE_NAME = "\xff"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(path, env={})


def test_directory_instead_of_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path, env={})


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})


def test_env_var_names_the_file(tmp_path):
    path = write(tmp_path, 'NODE_NAME = "from-env"\n')
    assert load_config(env={CONFIG_ENV_VAR: str(path)}).NODE_NAME == "from-env"
    assert resolve_config_path(env={CONFIG_ENV_VAR: str(path)}) == path


def test_argument_wins_over_env_var(tmp_path):
    arg = write(tmp_path, 'NODE_NAME = "from-arg"\n', "a.toml")
    env = write(tmp_path, 'NODE_NAME = "from-env"\n', "e.toml")
    assert load_config(arg, env={CONFIG_ENV_VAR: str(env)}).NODE_NAME == "from-arg"


def test_env_var_naming_a_missing_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match=CONFIG_ENV_VAR):
        load_config(env={CONFIG_ENV_VAR: str(tmp_path / "nope.toml")})


def test_default_path_is_used_without_argument_or_env():
    assert resolve_config_path(env={}) == DEFAULT_CONFIG_PATH == Path("/etc/mtgpu/mtgpu.toml")
    assert resolve_config_path(env={CONFIG_ENV_VAR: ""}) == DEFAULT_CONFIG_PATH


@pytest.mark.skipif(DEFAULT_CONFIG_PATH.exists(), reason="this machine has a real config")
def test_missing_default_file_says_how_to_create_one():
    with pytest.raises(ConfigError) as info:
        load_config(env={})
    message = str(info.value)
    assert message.startswith(str(DEFAULT_CONFIG_PATH))
    assert "mtgpu-setup install --yes" in message and "--config" in message


# ---------------------------------------------------------------- robustness

_TOML_SCALARS = st.one_of(
    st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12),
    st.sampled_from(["cluster", "simulated", "0.0.0.0:1", "/abs", "20G", "on", "[::1]:5"]),
)
_TOML_VALUES = st.recursive(
    _TOML_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
_KEYS = st.one_of(st.sampled_from(list(Config.model_fields)), st.text(max_size=10))


@settings(max_examples=300)
@given(st.dictionaries(_KEYS, _TOML_VALUES, max_size=6))
def test_any_parsed_toml_gives_a_config_or_a_config_error(d):
    try:
        config_from_dict(d)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


def test_workspace_keys_are_accepted_and_a_template_table_is_checked():
    c = config_from_dict({"CONTAINERS": {
        "publish_ports": False, "idle_timeout": "2h",
        "templates": {"base": "localhost/base:1",
                      "jupyter": {"image": "localhost/jupyter:1", "ports": [8888], "env": {"A": "b"},
                                  "command": "jupyter lab", "token_env": "JUPYTER_TOKEN", "url_path": "/lab",
                                  "gpus": 1, "cpus": 4, "mem": "16G", "gpu_mode": "shared", "vram": "8G"}}}}).CONTAINERS
    assert c.publish_ports is False and c.idle_timeout == "2h"
    assert c.templates["jupyter"]["command"] == ["/bin/sh", "-c", "jupyter lab"]
    assert c.allowed_images() == ["localhost/base:1", "localhost/jupyter:1"]


def test_containers_keys_of_container_jobs_are_accepted():
    c = config_from_dict({"CONTAINERS": {
        "enabled": True, "templates": {"torch": "localhost/torch:1"}, "images": ["localhost/base", "reg.lab:5000/a/b:1"],
        "registry_auth_file": "/root/auth.json", "cache_volume": "cache", "network": "host",
        "allow_user_images": True}}).CONTAINERS
    assert c.enabled and c.cache_volume == "cache" and c.network == "host" and c.allow_user_images
    assert c.allowed_images() == ["localhost/base", "reg.lab:5000/a/b:1", "localhost/torch:1"]


@pytest.mark.parametrize("key, value, words", [
    ("images", ["Bad Image"], "not an image name"),
    ("images", ["localhost/a", "localhost/a"], "listed twice"),
    ("templates", {"jup": {"ports": [8888]}}, "give its image"),
    ("templates", {"jup": {"image": "localhost/j", "port": 8888}}, "unknown key(s) port"),
    ("templates", {"jup": {"image": "localhost/j", "ports": [0]}}, "ports = [0]"),
    ("templates", {"jup": {"image": "localhost/j", "cpus": "many"}}, "cpus"),
    ("templates", {"jup": {"image": "localhost/j", "token_env": "a b"}}, "token_env"),
    ("templates", {"jup": 3}, "an image name or a table"),
    ("idle_timeout", "soon", "idle_timeout = 'soon'"),
    ("idle_timeout", "5s", "shorter than 10s"),
    ("cache_volume", "a/b", "not a Podman volume name"),
    ("network", "bridge", "slirp4netns"),
    ("registry_auth_file", "auth.json", "absolute"),
])
def test_bad_containers_values_name_the_key_the_value_and_the_fix(key, value, words):
    problem = only_problem({"CONTAINERS": {key: value}})
    assert problem.startswith(f"CONTAINERS.{key}") and words in problem, problem


def test_containers_enabled_false_is_accepted_as_it_says_what_happens():
    assert config_from_dict({"CONTAINERS": {"enabled": False}}).CONTAINERS.enabled is False


def test_gpu_policy_is_checked_and_defaults_to_stop_after_30s():
    c = config_from_dict({}).GPU_POLICY
    assert c.vram_overuse == "stop" and c.vram_grace_s == 30.0
    assert config_from_dict({"GPU_POLICY": {"vram_overuse": "warn", "vram_grace": "5s"}}).GPU_POLICY.vram_grace_s == 5
    assert "GPU_POLICY.vram_overuse" in only_problem({"GPU_POLICY": {"vram_overuse": "kill"}})
    problem = only_problem({"GPU_POLICY": {"vram_grace": "2d"}})
    assert problem.startswith("GPU_POLICY.vram_grace") and "1s to 1h" in problem, problem


# ---------------------------------------------------------------- [DIRECTLINK]


def test_directlink_defaults_and_a_full_section():
    c = config_from_dict({})
    assert c.DIRECTLINK.enabled is True and c.DIRECTLINK.relays == [] and c.DIRECTLINK.relay_listen == ""
    c = config_from_dict({"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab",
                          "DIRECTLINK": {"relays": ["relay.example.org:7443", "[2001:db8::1]:7443"],
                                         "relay_listen": "0.0.0.0:7443"}})
    assert c.DIRECTLINK.relays[1] == "[2001:db8::1]:7443" and c.DIRECTLINK.relay_listen == "0.0.0.0:7443"


@pytest.mark.parametrize("section, fragment", [
    ({"relays": ["relay.example.org"]}, "DIRECTLINK.relays[0]"),
    ({"relays": ["r:7443", "r:7443"]}, "names a relay twice"),
    ({"relay_listen": "7443"}, "DIRECTLINK.relay_listen"),
    ({"enabled": "yes"}, "DIRECTLINK.enabled"),
    ({"relay": ["r:7443"]}, "unknown key 'DIRECTLINK.relay' (did you mean 'relays'?"),
])
def test_directlink_bad_values_name_the_key(section, fragment):
    problem = only_problem({"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab", "DIRECTLINK": section})
    assert fragment in problem, problem


def test_directlink_relays_on_a_standalone_node_are_refused_with_the_fix():
    problem = only_problem({"DIRECTLINK": {"relays": ["r:7443"]}})
    assert "CLUSTER_MODE = \"cluster\"" in problem and "cluster of one" in problem, problem
    assert config_from_dict({"DIRECTLINK": {"enabled": False, "relays": ["r:7443"]}}).DIRECTLINK.enabled is False
