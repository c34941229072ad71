"""Whatever serves a mode: launched vLLM servers, servers run elsewhere, fleets behind a router.

Owns the deployment interface (``interface``: ``Deployment``, ``ServerInfo``, ``ServerError``), child
processes and their cleanup (``process``; ``guard`` when pytest is killed outright), one launched process
from start to stop (``executor``), one server reached over HTTP (``endpoint``: readiness, reset, scrapes,
tokenizing), the vLLM server kinds (``server``: launched and external), a launched server's command line
(``command``) and environment (``launch_env``), the plugin's HTTP client (``client``), fleets (``fleet``)
and the router in front of a launched one (``router``), which kind serves a mode (``deployment``), the
server log watch (``logwatch``), short probes of servers run elsewhere (``probe``), the GPUs (``gpus``),
the server's counters (``metrics``) and the checks before any server starts (``preflight``).

Layer: above ``workload``; may import ``workload``, ``config`` and ``redaction``.
"""
