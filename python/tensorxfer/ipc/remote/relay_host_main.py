"""The relay host's process (``python -m tensorxfer.ipc.remote.relay_host_main``; see
:mod:`tensorxfer.ipc.remote.relay_host`). A module of its own, which the package never imports, so
that ``-m`` runs it fresh."""

from tensorxfer.ipc.remote.relay_host import serve_forever

serve_forever()
