"""The core's own commands, one module per command (or command group), named for it:
`gpubox/commands/<command>.py` defines the click command `<command>`, listed in gpubox.cli.COMMANDS
as "gpubox.commands.<command>:<command>". An area's commands follow the same rule in
`<area>/commands/` and are listed in its `area.py` (docs/architecture.md, "How to add a command")."""
