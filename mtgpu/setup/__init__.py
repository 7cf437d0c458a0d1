"""Installing, checking and removing a node (`mtgpu-setup install|status|uninstall`,
docs/INSTALL.md): plan.py runs steps that each check whether they are already done;
install.py and uninstall.py make the steps; service.py is the systemd unit or the init
script and its boot hook; environment.py the packages, the venv and the command links."""
