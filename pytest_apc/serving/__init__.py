"""Whatever serves a mode: launched vLLM servers, servers run elsewhere, fleets behind a router.

Owns the deployment interface (``interface``: ``Deployment``, ``ServerInfo``), child processes and their
cleanup (``process``), one launched process from start to stop (``executor``), the vLLM server kinds
(``server``), fleets (``fleet``) and the router in front of a launched one (``router``), which kind
serves a mode (``deployment``), the server log watch (``logwatch``), short probes of servers run
elsewhere (``probe``), the GPUs (``gpus``) and the server's counters (``metrics``).

Layer: above ``workload``; may import ``workload``, ``config`` and ``redaction``.
"""
