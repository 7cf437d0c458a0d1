"""The terminal app behind remotegpu-cli (docs/TUI.md): view model, data source, textual views."""
