"""The node's own OpenSSH daemon for tenants: keys only, persistent tmux terminals.

config.py renders the sshd_config (pure), wrapper.py is the login wrapper sshd runs
as the tenant, daemon.py prepares the files and runs the process. See docs/SSH.md.
"""

from mtgpu.ssh.config import AuthorizedKeysCommand, SshConfigError, render_sshd_config
from mtgpu.ssh.daemon import SshdError, TenantSshd, check_installed

__all__ = ["AuthorizedKeysCommand", "SshConfigError", "SshdError", "TenantSshd", "check_installed",
           "render_sshd_config"]
