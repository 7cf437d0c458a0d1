"""The tenant sshd's generated config, the login wrapper's choice and key validation (no processes,
except one `sshd -t` that checks the real sshd accepts what we render)."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from mtgpu.ssh.config import AuthorizedKeysCommand, SshConfigError, parse_listen, render_sshd_config
from mtgpu.ssh.daemon import SshdError, validate_public_key
from mtgpu.ssh.wrapper import terminal_choice

ED25519 = "ssh-ed25519 " + base64.b64encode(
    len(b"ssh-ed25519").to_bytes(4, "big") + b"ssh-ed25519" + (32).to_bytes(4, "big") + bytes(32)).decode()


def make_config(**overrides) -> str:
    args = dict(listen_host="0.0.0.0", listen_port=2222, host_key_paths=["/var/lib/mtgpu/ssh/ssh_host_ed25519_key"],
                pid_file="/var/lib/mtgpu/ssh/sshd.pid",
                authorized_keys_command_or_file="/var/lib/mtgpu/ssh/authorized_keys/%u",
                tenant_group="mtgpu-tenants", login_wrapper="/var/lib/mtgpu/ssh/mtgpu-login",
                persistent_terminals="on")
    args.update(overrides)
    return render_sshd_config(**args)


def directives(text: str) -> dict[str, list[str]]:
    """keyword (lower-case) -> every value it is given, in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            out.setdefault(key.lower(), []).append(value.strip())
    return out


@pytest.mark.parametrize("keyword, value", [
    ("authenticationmethods", "publickey"),
    ("pubkeyauthentication", "yes"),
    ("passwordauthentication", "no"),
    ("kbdinteractiveauthentication", "no"),
    ("hostbasedauthentication", "no"),
    ("permitemptypasswords", "no"),
    ("permitrootlogin", "no"),
    ("allowgroups", "mtgpu-tenants"),
    ("usepam", "no"),
    ("strictmodes", "yes"),
    ("permituserenvironment", "no"),
    ("x11forwarding", "no"),
    ("allowtcpforwarding", "yes"),
    ("permittunnel", "no"),
    ("authorizedkeysfile", "/var/lib/mtgpu/ssh/authorized_keys/%u"),
    ("acceptenv", "LANG LC_* MTGPU_TERMINAL MTGPU_WORKSPACE MTGPU_JOB"),
    ("subsystem", "sftp internal-sftp"),
    ("forcecommand", "/var/lib/mtgpu/ssh/mtgpu-login --terminals on"),
    ("pidfile", "/var/lib/mtgpu/ssh/sshd.pid"),
    ("hostkey", "/var/lib/mtgpu/ssh/ssh_host_ed25519_key"),
    ("listenaddress", "0.0.0.0:2222"),
])
def test_config_has_every_security_relevant_line_once(keyword, value):
    assert directives(make_config())[keyword] == [value]


def test_config_never_includes_the_system_sshd_config_and_has_no_match_block():
    found = directives(make_config())
    assert "include" not in found and "match" not in found  # ForceCommand applies to every login


def test_every_path_in_the_config_is_absolute():
    found = directives(make_config())
    for keyword in ("hostkey", "pidfile", "authorizedkeysfile"):
        assert all(v.startswith("/") for v in found[keyword]), keyword
    assert found["forcecommand"][0].startswith("/")


@pytest.mark.parametrize("mode", ["on", "optional", "off"])
def test_the_terminal_mode_is_baked_into_the_force_command(mode):
    assert directives(make_config(persistent_terminals=mode))["forcecommand"] == [
        f"/var/lib/mtgpu/ssh/mtgpu-login --terminals {mode}"]


def test_several_host_keys_and_an_ipv6_listen_address():
    found = directives(make_config(listen_host="::1", listen_port=2022, host_key_paths=["/k/a", "/k/b"]))
    assert found["listenaddress"] == ["[::1]:2022"]
    assert found["hostkey"] == ["/k/a", "/k/b"]


def test_keys_from_a_command_replace_the_keys_file():
    found = directives(make_config(authorized_keys_command_or_file=AuthorizedKeysCommand("/usr/lib/mtgpu/keys %u")))
    assert found["authorizedkeysfile"] == ["none"]
    assert found["authorizedkeyscommand"] == ["/usr/lib/mtgpu/keys %u"]
    assert found["authorizedkeyscommanduser"] == ["nobody"]


@pytest.mark.parametrize("overrides, names", [
    (dict(persistent_terminals="sometimes"), "PERSISTENT_TERMINALS"),
    (dict(pid_file="run/sshd.pid"), "PidFile"),
    (dict(host_key_paths=["keys/host"]), "host key"),
    (dict(host_key_paths=[]), "host key"),
    (dict(login_wrapper="mtgpu-login"), "login wrapper"),
    (dict(authorized_keys_command_or_file="~/.ssh/authorized_keys"), "AuthorizedKeysFile"),
    (dict(authorized_keys_command_or_file="/var/lib/mtgpu/ssh/all_keys"), "%u"),
    (dict(authorized_keys_command_or_file=AuthorizedKeysCommand("keys %u")), "AuthorizedKeysCommand"),
    (dict(tenant_group="Tenants Group"), "tenant group"),
    (dict(listen_port=0), "port"),
])
def test_bad_values_are_refused_with_the_name_of_the_setting(overrides, names):
    with pytest.raises(SshConfigError, match=names):
        make_config(**overrides)


def test_listen_addresses_parse_and_bad_ones_name_ssh_listen():
    assert parse_listen("0.0.0.0:2222") == ("0.0.0.0", 2222)
    assert parse_listen("[::]:22") == ("::", 22)
    for bad in ("2222", "host:", "host:99999", ":22"):
        with pytest.raises(SshConfigError, match="SSH_LISTEN"):
            parse_listen(bad)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/sbin/sshd", os.X_OK),
                    reason="sshd -t needs root and openssh-server")
def test_the_real_sshd_accepts_the_rendered_config(tmp_path):
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    config = tmp_path / "sshd_config"
    config.write_text(make_config(listen_host="127.0.0.1", host_key_paths=[str(key)],
                                  pid_file=str(tmp_path / "sshd.pid"), tenant_group="root"))
    r = subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(config)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ----- the login wrapper's choice ------------------------------------------------

@pytest.mark.parametrize("mode, sent, home_file, expected", [
    ("on", None, None, True),
    ("on", "plain", None, False),
    ("on", None, "no-tmux", False),
    ("on", "tmux", "no-tmux", True),          # this terminal's choice wins over the file
    ("optional", None, None, False),
    ("optional", "tmux", None, True),
    ("optional", None, "tmux", True),
    ("optional", "plain", "tmux", False),
    ("off", "tmux", "tmux", False),
    ("on", "bogus", None, True),               # unknown value: warned, mode's default
])
def test_terminal_choice(tmp_path, mode, sent, home_file, expected):
    if home_file:
        (tmp_path / ".mtgpu").mkdir()
        (tmp_path / ".mtgpu" / home_file).touch()
    use_tmux, session, warning = terminal_choice(mode, sent, str(tmp_path), True)
    assert use_tmux is expected and session == "main"
    assert (warning is not None) == (sent == "bogus")


def test_without_a_terminal_there_is_never_tmux(tmp_path):
    assert terminal_choice("on", "tmux", str(tmp_path), False)[0] is False


def test_a_terminal_can_name_its_own_tmux_session(tmp_path):
    assert terminal_choice("optional", "tmux:train", str(tmp_path), True) == (True, "train", None)
    use_tmux, session, warning = terminal_choice("on", "tmux:../x y", str(tmp_path), True)
    assert (use_tmux, session) == (True, "main") and "session name" in warning


# ----- keys ----------------------------------------------------------------------

def test_a_plain_public_key_is_accepted_with_its_comment():
    assert validate_public_key(ED25519 + " alice@laptop\n") == ED25519 + " alice@laptop"


@pytest.mark.parametrize("line, message", [
    ('command="/bin/sh" ' + ED25519, "not an OpenSSH public key"),
    (ED25519 + "\nssh-ed25519 AAAA", "one line"),
    ("ssh-rsa " + ED25519.split()[1], "does not match its type"),
    ("ssh-ed25519 not*base64", "base64"),
    ("", "not an OpenSSH public key"),
])
def test_key_lines_with_options_several_lines_or_bad_data_are_refused(line, message):
    with pytest.raises(SshdError, match=message):
        validate_public_key(line)


def test_every_session_variable_is_on_the_one_setenv_line_sshd_reads():
    # sshd uses the first SetEnv line and ignores the others: all pairs go on one line.
    text = render_sshd_config("127.0.0.1", 2222, ["/k"], "/p", "/keys/%u", "mtgpu-tenants", "/w", "on",
                              set_env={"MTGPU_SOCKET": "/s", "MTGPU_PYTHON": "/py"})
    lines = [line for line in text.splitlines() if line.startswith("SetEnv")]
    assert lines == ["SetEnv MTGPU_PYTHON=/py MTGPU_SOCKET=/s"]
