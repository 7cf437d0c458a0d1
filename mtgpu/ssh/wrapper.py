"""The tenant sshd's login wrapper (ForceCommand), run by sshd as the tenant.

Installed by TenantSshd.prepare() as a root-owned copy with a shebang line
(`#!/usr/bin/python3 -IS`: isolated mode, no site packages), so it needs nothing
but the standard library and starts in a few milliseconds. sshd runs it for every session:

* a command (`ssh host cmd`, scp, rsync, VS Code's server) -> the user's shell
  `-c "$SSH_ORIGINAL_COMMAND"`, directly, never inside tmux;
* sftp (`SSH_ORIGINAL_COMMAND=internal-sftp`) -> the sftp-server binary;
* an interactive login with a terminal -> `tmux new-session -A -s main` or a plain
  login shell, by PERSISTENT_TERMINALS (`--terminals on|optional|off`) and the
  tenant's choice for this terminal (MTGPU_TERMINAL) or for all of them
  (~/.mtgpu/no-tmux, ~/.mtgpu/tmux);
* no terminal and no command (`ssh -T host`, piped stdin) -> plain login shell;
* MTGPU_WORKSPACE=NAME (`ssh -o SetEnv=MTGPU_WORKSPACE=NAME`): the same, inside the
  tenant's workspace NAME (`mt-container shell`/`exec`), in a tmux session `ws-NAME`
  per PERSISTENT_TERMINALS; sftp stays on the node.
* MTGPU_JOB=ID (`ssh -o SetEnv=MTGPU_JOB=ID`): the same, adopted by the tenant's running
  job ID on this node (`mt-job attach ID`: the job's cgroups, so exactly its GPUs, and its
  CUDA_VISIBLE_DEVICES), in a tmux session `job-ID` per PERSISTENT_TERMINALS; sftp stays
  in the session (no GPU). Without either, a session holds no GPU (docs/ISOLATION.md).

Do not import anything of mtgpu here: this file runs outside the package.
"""

import os
import pwd
import re
import sys

SFTP_SERVER_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",      # Debian, Ubuntu
    "/usr/libexec/openssh/sftp-server",  # Fedora, RHEL
    "/usr/lib/ssh/sftp-server",          # Arch, openSUSE
    "/usr/libexec/sftp-server",
)
TMUX_CANDIDATES = ("/usr/bin/tmux", "/usr/local/bin/tmux", "/bin/tmux")
DEFAULT_SESSION = "main"
_SESSION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_JOB_RE = re.compile(r"^[0-9]{1,12}$")

PLAIN_WORDS = ("plain", "shell", "no-tmux", "off", "0", "no")
TMUX_WORDS = ("tmux", "on", "1", "yes")


def terminal_choice(mode, env_value, home, has_tty):
    """(use_tmux, session_name, warning or None) for an interactive login.

    `mode` is PERSISTENT_TERMINALS; `env_value` is MTGPU_TERMINAL as sent by the
    client (`plain`, `tmux` or `tmux:NAME`), which wins over the files in ~/.mtgpu.
    """
    if not has_tty or mode == "off":
        return False, DEFAULT_SESSION, None
    session = DEFAULT_SESSION
    warning = None
    wanted = None  # None: no choice for this terminal
    if env_value:
        word, _, name = env_value.strip().partition(":")
        word = word.lower()
        if word in PLAIN_WORDS:
            wanted = False
        elif word in TMUX_WORDS:
            wanted = True
            if name:
                if _SESSION_RE.match(name):
                    session = name
                else:
                    warning = f"mtgpu: ignoring tmux session name {name!r} (letters, digits, . _ - only)"
        else:
            warning = f"mtgpu: ignoring MTGPU_TERMINAL={env_value!r} (use 'plain' or 'tmux')"
    if wanted is None and home:
        if mode == "on" and os.path.exists(os.path.join(home, ".mtgpu", "no-tmux")):
            wanted = False
        elif mode == "optional" and os.path.exists(os.path.join(home, ".mtgpu", "tmux")):
            wanted = True
    if wanted is None:
        wanted = mode == "on"
    return wanted, session, warning


def _parse_args(argv):
    opts = {"terminals": "on", "sftp-server": None, "tmux": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key = arg[2:] if arg.startswith("--") else None
        if key in opts and i + 1 < len(argv):
            opts[key] = argv[i + 1]
            i += 2
            continue
        sys.stderr.write(f"mtgpu login wrapper: unknown argument {arg!r}\n")
        i += 1
    if opts["terminals"] not in ("on", "optional", "off"):
        sys.stderr.write(f"mtgpu login wrapper: bad --terminals {opts['terminals']!r}, using 'off'\n")
        opts["terminals"] = "off"
    return opts


def _first_executable(preferred, candidates):
    for path in ((preferred,) if preferred else ()) + tuple(candidates):
        if path and os.access(path, os.X_OK):
            return path
    return None


def user_shell():
    """$SHELL, else the passwd entry's shell, else /bin/sh (also `mt-job attach`'s default command)."""
    shell = os.environ.get("SHELL")
    if not shell:
        try:
            shell = pwd.getpwuid(os.getuid()).pw_shell
        except KeyError:
            shell = None
    return shell or "/bin/sh"


def workspace_argv(name, command, use_tmux, tmux, session):
    """What an SSH login into the workspace `name` runs (None: `name` is not a name)."""
    if not _SESSION_RE.match(name):
        return None
    python = os.environ.get("MTGPU_PYTHON") or "/usr/bin/python3"
    base = [python, "-m", "mtgpu.cli.container"]
    if command is not None:
        return base + ["exec", name, "--", "/bin/sh", "-c", command]
    if use_tmux and tmux:
        return [tmux, "new-session", "-A", "-s", "ws-" + name if session == DEFAULT_SESSION else session,
                " ".join(_quote(a) for a in base + ["shell", name])]
    return base + ["shell", name]


def job_argv(job, command, use_tmux, tmux, session, shell):
    """What an SSH login adopted by the job `job` runs (None: `job` is not a job id): `mt-job
    attach`, which moves itself into the job's cgroups before it execs the command or the
    shell. In tmux the pane's own process does so (the tmux server stays in the sessions
    group, which holds no GPU); `env` carries what it needs into a tmux server started by
    an earlier login, and --hold keeps a refusal on screen."""
    if not _JOB_RE.match(job):
        return None
    python = os.environ.get("MTGPU_PYTHON") or "/usr/bin/python3"
    base = [python, "-m", "mtgpu.cli.job", "attach"]
    if command is not None:
        return base + [job, "--", shell, "-c", command]
    if use_tmux and tmux:
        keep = [f"{k}={os.environ[k]}" for k in ("PYTHONPATH", "MTGPU_SOCKET") if os.environ.get(k)]
        line = ["env", *keep, *base, "--hold", job]
        return [tmux, "new-session", "-A", "-s", "job-" + job if session == DEFAULT_SESSION else session,
                " ".join(_quote(a) for a in line)]
    return base + [job]


def _quote(word):
    return word if re.match(r"^[A-Za-z0-9_./=:-]+$", word) else "'" + word.replace("'", "'\\''") + "'"


def _terminal(opts):
    """terminal_choice() for this login (its terminal, the tenant's choice, PERSISTENT_TERMINALS):
    (use_tmux, session); a warning it gives goes to stderr."""
    has_tty = os.isatty(0) and os.isatty(1)
    use_tmux, session, warning = terminal_choice(
        opts["terminals"], os.environ.get("MTGPU_TERMINAL"), os.environ.get("HOME"), has_tty)
    if warning:
        sys.stderr.write(warning + "\n")
    return use_tmux, session


def main(argv):
    opts = _parse_args(argv)
    shell = user_shell()
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    workspace = os.environ.get("MTGPU_WORKSPACE")
    job = os.environ.get("MTGPU_JOB")
    if workspace and job:
        sys.stderr.write("mtgpu: set MTGPU_WORKSPACE or MTGPU_JOB, not both: a session lands in one reservation\n")
        return 2
    if job and not (command or "").startswith("internal-sftp"):
        use_tmux, session = _terminal(opts)
        if os.environ.get("MTGPU_PKG_ROOT"):
            os.environ["PYTHONPATH"] = os.environ["MTGPU_PKG_ROOT"]
        target = job_argv(job, command, use_tmux, _first_executable(opts["tmux"], TMUX_CANDIDATES), session, shell)
        if target is None:
            sys.stderr.write(f"mtgpu: MTGPU_JOB={job!r} is not a job id (a number, as `mt-job list` shows)\n")
            return 2
        os.execv(target[0], target)
    if workspace and not (command or "").startswith("internal-sftp"):
        use_tmux, session = _terminal(opts)
        target = workspace_argv(workspace, command, use_tmux, _first_executable(opts["tmux"], TMUX_CANDIDATES),
                                session)
        if target is None:
            sys.stderr.write(f"mtgpu: MTGPU_WORKSPACE={workspace!r} is not a workspace name\n")
            return 2
        if os.environ.get("MTGPU_PKG_ROOT"):
            os.environ["PYTHONPATH"] = os.environ["MTGPU_PKG_ROOT"]
        os.execv(target[0], target)
    if command is not None:
        words = command.split()
        if words and words[0] == "internal-sftp":
            server = _first_executable(opts["sftp-server"], SFTP_SERVER_CANDIDATES)
            if server is None:
                sys.stderr.write("mtgpu: sftp is not available on this node "
                                 "(the admin can install the openssh-sftp-server package)\n")
                return 1
            os.execv(server, [server] + words[1:])
        # Exactly what sshd does without a ForceCommand: the user's shell runs it.
        os.execv(shell, [os.path.basename(shell), "-c", command])

    use_tmux, session = _terminal(opts)
    if use_tmux:
        tmux = _first_executable(opts["tmux"], TMUX_CANDIDATES)
        if tmux is not None:
            os.execv(tmux, ["tmux", "new-session", "-A", "-s", session])
        sys.stderr.write("mtgpu: tmux is not installed on this node; starting a plain shell\n")
    # A login shell, as sshd would start it ("-bash").
    os.execv(shell, ["-" + os.path.basename(shell)])
    return 127  # not reached


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as e:  # exec failed: a missing shell or binary
        sys.stderr.write(f"mtgpu login wrapper: cannot start {e.filename or 'the session'}: {e.strerror}\n")
        sys.exit(127)
