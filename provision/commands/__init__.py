"""The provision area's commands, one module per command (or command group), named for it:
`provision/commands/<command>.py` defines the click command `<command>`, registered in provision/area.py as
"gpubox.provision.commands.<command>:<command>". They parse options and call the area's library
(docs/architecture.md, "How to add a command")."""
