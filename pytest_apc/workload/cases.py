"""The A-F matrix, the concurrency sweep, and what each case predicts.

| case | prefix | suffix | APC | family   | vLLM dataset                          |
|------|--------|--------|-----|----------|---------------------------------------|
| A    | 0      | 32K    | off | overhead | random, input 32768, prefix 0         |
| B    | 0      | 32K    | on  | overhead | same                                  |
| C    | 32K    | 1K     | off | pure     | prefix_repetition, 32768 + 1024, 1 pfx|
| D    | 32K    | 1K     | on  | pure     | same                                  |
| E    | 32K    | 32K    | off | rag      | random, input 32768, prefix 32000     |
| F    | 32K    | 32K    | on  | rag      | same                                  |
| R    | 32K    | 1K     | on  | fleet    | prefix_repetition, G prefixes, routed |
| N    | 32K    | 1K     | on  | offload  | prefix_repetition, G prefixes; small GPU cache, no tier |
| O    | 32K    | 1K     | on  | offload  | same; small GPU cache + a CPU tier (--kv-offloading-size) |
| L    | 8K     | turns  | off | multiturn| custom (message lists): G conversations x T turns, one run per turn |
| M    | 8K     | turns  | on  | multiturn| same                                  |

R is the fleet case: C/D's lengths in G prefix groups (``--apc-set prefix_groups``), sent through a router
(one run per route: a router policy, vLLM's data-parallel balancer, or an external gateway) to several
replicas; its verdicts read every replica's counters (``cold_prefills``).

N and O are the second cache tier: G prefix groups whose working set does not fit a deliberately small
GPU cache (``offload.py`` sizes it, and the tier, from the workload and the model's KV bytes per token). N
has nothing behind the GPU cache, so evicted prefixes are computed again (``eviction.py`` predicts its hits
at concurrency 1); O keeps evicted blocks in CPU memory and loads them back: its hits across both tiers are
the prediction of one server with room for everything.

A *workload* is what the benchmark sends; the ON and OFF case of a pair share it byte for byte.
The expected cache hits are computed from the workload's shape, the server's block size and the chat
template's shared header; never hard-coded. ``predict`` here gives a cold server's hits when every prefix
stays cached (A-F and R; O's across both tiers); ``measure/run.py`` calls it. The others are computed where
the server's own numbers are known: N's GPU-cache hits in ``measure/run.py`` (vLLM's block pool replayed
over the requests as sent, ``eviction.local_hits``), and M/L's per-turn hits in ``measure/multiturn.py``
(``multiturn.predict_rounds`` over the tokens the server prefills).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_apc.config import DATA_PARALLEL, EXTERNAL_FLEET, ROUTER_POLICIES, Settings

FAMILIES = ("overhead", "pure", "rag", "fleet", "offload", "multiturn")
# The length settings each family's workload reads: (its shared prefix, None for none; its unique suffix).
# Declared once: workload_for reads them, and the plan warns of a given length that no selected case reads.
FAMILY_LENGTHS: dict[str, tuple[str | None, str]] = {
    "overhead": (None, "input_len"),
    "pure": ("prefix_len", "suffix_len"),
    "rag": ("rag_prefix_len", "input_len"),
    "fleet": ("prefix_len", "suffix_len"),
    "offload": ("prefix_len", "suffix_len"),
    "multiturn": ("multiturn_prefix_len", "multiturn_user_len"),  # and the reply, summary and turn settings
}
# Compared case -> its baseline in a pair: ON -> OFF, and the offload tier -> the same cache without one.
PAIRS = {"B": "A", "D": "C", "F": "E", "O": "N", "M": "L"}
CASE_FAMILY = {
    "A": "overhead", "B": "overhead", "C": "pure", "D": "pure", "E": "rag", "F": "rag", "R": "fleet",
    "N": "offload", "O": "offload", "L": "multiturn", "M": "multiturn",
}  # fmt: skip
CASE_APC = {
    "A": False, "B": True, "C": False, "D": True, "E": False, "F": True, "R": True, "N": True, "O": True,
    "L": False, "M": True,
}  # fmt: skip
# The families whose servers are not the user's plain server: measured only when selected by their marker,
# never as part of ``-m apc`` (a fleet needs a router and replicas; the offload tier tens of GiB of pinned
# host memory and a GPU).
OWN_MARKER_FAMILIES = ("fleet", "offload", "multiturn")
# The markers of the suite's test families (tests_apc), beside apc: a case family's, or the sweep's, or the
# hash-algorithm comparison's.
FAMILY_MARKERS = (*FAMILIES, "sweep", "hash_algo")
CASE_PURPOSE = {
    "A": "baseline, no shared prefix",
    "B": "APC overhead (A ~ B expected)",
    "C": "pure APC baseline",
    "D": "pure APC effect",
    "E": "agent/RAG baseline",
    "F": "agent/RAG APC effect",
    "R": "prefix groups routed across replicas",
    "N": "small GPU cache, no tier: evicted prefixes recomputed",
    "O": "small GPU cache + CPU offload tier",
    "L": "multi-turn conversations, APC off",
    "M": "multi-turn conversations: hits grow turn by turn",
}
# The multi-turn case's variant in which every history is replaced by a summary after K turns (M-c8-compact).
COMPACT = "compact"
# The offload case's servers: a GPU cache too small for the working set, without and with a CPU tier. The
# multi-turn case's variants on such servers (M-c1-small-cache, M-c1-offload-tier) carry the same names; their
# servers are sized for the conversations, so they are servers of their own (the cache named "multiturn-...").
SMALL_CACHE = "small-cache"
OFFLOAD_TIER = "offload-tier"
TIER_VARIANTS = (SMALL_CACHE, OFFLOAD_TIER)
MULTITURN_CACHE = "multiturn-"
# The fleet case's routes (ROUTER_POLICIES, DATA_PARALLEL, EXTERNAL_FLEET) are config's: the settings choose them.


@dataclass(frozen=True)
class Workload:
    """What one benchmark run sends: identical for the ON and OFF server of a pair."""

    family: str
    prefix_len: int  # shared prefix, in tokens (client side, before the chat template)
    suffix_len: int  # unique part per request
    output_len: int
    num_prompts: int
    seed: int
    prefix_groups: int = 1  # G distinct prefixes, num_prompts / G requests each (prefix_repetition)

    @property
    def dataset(self) -> str:
        if self.family == "multiturn":
            return "custom"
        return "prefix_repetition" if self.family in ("pure", "fleet", "offload") else "random"

    def dataset_args(self) -> list[str]:
        """The dataset flags of ``vllm bench serve`` for this workload (the multi-turn case adds the
        ``--dataset-path`` of each round's file)."""
        if self.dataset == "custom":
            return ["--dataset-name", "custom", "--custom-output-len", str(self.output_len), "--disable-shuffle"]
        if self.dataset == "prefix_repetition":
            return [
                "--dataset-name", "prefix_repetition",
                "--prefix-repetition-prefix-len", str(self.prefix_len),
                "--prefix-repetition-suffix-len", str(self.suffix_len),
                "--prefix-repetition-num-prefixes", str(self.prefix_groups),
                "--prefix-repetition-output-len", str(self.output_len),
            ]  # fmt: skip
        return [
            "--dataset-name", "random",
            "--random-input-len", str(self.suffix_len),
            "--random-prefix-len", str(self.prefix_len),
            "--random-output-len", str(self.output_len),
            "--random-range-ratio", "0",
        ]  # fmt: skip

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.suffix_len

    def kv_blocks_per_request(self, header_tokens: int, block_size: int) -> int:
        """KV-cache blocks one request holds at its longest: template header, prompt and output."""
        return ceil_div(header_tokens + self.prompt_len + self.output_len, block_size)

    def shared_blocks(self, header_tokens: int, block_size: int) -> int:
        """The whole blocks of the prefix every request of a group shares, template header included."""
        return (header_tokens + self.prefix_len) // block_size

    def kv_working_set(self, concurrency: int, header_tokens: int, block_size: int, apc: bool) -> tuple[int, str]:
        """The KV-cache blocks ``concurrency`` requests hold at once at their longest, and that sum in words.

        Without APC each request holds all its blocks. With APC a cached block is shared by every request
        that uses it, so the shared prefix is held once: the template header's blocks once, each prefix
        group's own blocks once per group in flight. Counting it per request would warn (and, under
        ``kv_check=fail``, refuse) a run such as F-c8 whose working set fits.
        """
        per_request = self.kv_blocks_per_request(header_tokens, block_size)
        header = header_tokens // block_size
        shared = self.shared_blocks(header_tokens, block_size)
        held_once = header + min(concurrency, self.prefix_groups) * (shared - header)
        if not apc or held_once == 0:
            return concurrency * per_request, f"concurrency {concurrency} x {per_request} blocks per request"
        own = per_request - shared
        words = f"concurrency {concurrency} x {own} blocks per request + {held_once} shared prefix blocks held once"
        return concurrency * own + held_once, words


def workload_for(family: str, settings: Settings) -> Workload:
    """The family's workload under these settings (lengths scaled for the CPU profile)."""
    s = settings.scaled
    if family == "multiturn":
        # One round: one request per conversation. Its suffix is the longest conversation's own part (every
        # turn's user message and reply), so that the context and the KV check cover the last turn.
        turns = settings.multiturn_turns
        own = turns * (s(settings.multiturn_user_len) + s(settings.multiturn_reply_len))
        return Workload(
            family, s(settings.multiturn_prefix_len), own, s(settings.multiturn_reply_len),
            settings.multiturn_conversations, settings.seed,
        )  # fmt: skip
    if family not in FAMILY_LENGTHS:  # pragma: no cover - guarded by FAMILIES
        raise ValueError(f"unknown case family {family!r}")
    prefix_setting, suffix_setting = FAMILY_LENGTHS[family]
    prefix = s(getattr(settings, prefix_setting)) if prefix_setting else 0
    suffix = s(getattr(settings, suffix_setting))
    if family == "offload":
        # vLLM's prefix_repetition sends num_prompts // G per group: ask for exactly what it sends.
        groups = settings.offload_groups
        prompts = settings.num_prompts // groups * groups
        return Workload(family, prefix, suffix, s(settings.offload_output_len), prompts, settings.seed, groups)
    groups = settings.prefix_groups if family == "fleet" else 1
    return Workload(family, prefix, suffix, s(settings.output_len), settings.num_prompts, settings.seed, groups)


@dataclass(frozen=True, order=True)
class ServerMode:
    """Which server: APC on or off, and (APC on only) a prefix-caching hash algorithm."""

    apc: bool
    hash_algo: str = ""
    fleet: str = ""  # "" one server; "router": replicas behind a router; "dp": a data-parallel server; "external"
    cache: str = ""  # "" the server's own KV cache; SMALL_CACHE or OFFLOAD_TIER, after MULTITURN_CACHE for case M

    @property
    def tier(self) -> bool:
        """Whether the server has a CPU offload tier behind its GPU cache."""
        return self.cache.endswith(OFFLOAD_TIER)

    @property
    def cache_family(self) -> str:
        """The case family a small-cache server is sized for ("" for a server with its own KV cache)."""
        if not self.cache:
            return ""
        return "multiturn" if self.cache.startswith(MULTITURN_CACHE) else "offload"

    @property
    def name(self) -> str:
        name = ("apc-on" if self.apc else "apc-off") + (f"-{self.hash_algo}" if self.hash_algo else "")
        return name + (f"-fleet-{self.fleet}" if self.fleet else "") + (f"-{self.cache}" if self.cache else "")


def ceil_div(tokens: int, block_size: int) -> int:
    """Whole blocks that ``tokens`` occupy (a partial block still takes a block)."""
    return -(-tokens // block_size)


@dataclass(frozen=True, order=True)
class RunKey:
    """One measurement: a case at a concurrency (and, for APC-on cases, a hash algorithm)."""

    case: str
    concurrency: int
    hash_algo: str = ""  # "" = the server's default
    route: str = ""  # fleet case: a router policy, DATA_PARALLEL or an external fleet's label; case M: a policy
    variant: str = ""  # multi-turn case only: "", COMPACT, or one of TIER_VARIANTS (its small-cache servers)

    @property
    def apc(self) -> bool:
        return CASE_APC[self.case]

    @property
    def family(self) -> str:
        return CASE_FAMILY[self.case]

    @property
    def mode(self) -> ServerMode:
        """The deployment this run is measured on (every router policy shares one fleet of replicas)."""
        if self.family == "offload":
            return ServerMode(True, cache=OFFLOAD_TIER if self.case == "O" else SMALL_CACHE)
        if self.family == "multiturn" and not self.route:
            return ServerMode(self.apc, cache=MULTITURN_CACHE + self.variant if self.variant in TIER_VARIANTS else "")
        if not self.route:
            return ServerMode(self.apc, self.hash_algo)
        if self.route in ROUTER_POLICIES:
            fleet = "router"
        else:
            fleet = DATA_PARALLEL if self.route == DATA_PARALLEL else EXTERNAL_FLEET
        return ServerMode(self.apc, self.hash_algo, fleet)

    @property
    def id(self) -> str:
        label = self.route or self.hash_algo or self.variant
        suffix = f"-{label}" if label else ""
        return f"{self.case}-c{self.concurrency}{suffix}"

    @classmethod
    def parse(cls, text: str) -> RunKey:
        """``"D-c8"``, ``"D-c8-xxhash"``, (fleet) ``"R-c4-round_robin"``, ``"R-c8-<route label>"`` or (case M
        behind the router) ``"M-c8-consistent_hash"`` -> RunKey."""
        parts = text.split("-", 2)
        if len(parts) < 2 or parts[0] not in CASE_APC or not parts[1].startswith("c"):
            raise ValueError(f"not a run id: {text!r} (expected e.g. 'D-c8')")
        last = parts[2] if len(parts) == 3 else ""
        if CASE_FAMILY[parts[0]] == "fleet":
            if not last:
                raise ValueError(f"not a fleet run id: {text!r} (expected e.g. 'R-c4-round_robin')")
            return cls(parts[0], int(parts[1][1:]), route=last)
        if CASE_FAMILY[parts[0]] == "multiturn":
            if last in ("", COMPACT, *TIER_VARIANTS):
                return cls(parts[0], int(parts[1][1:]), variant=last)
            return cls(parts[0], int(parts[1][1:]), route=last)  # case M behind the router: its policy
        return cls(parts[0], int(parts[1][1:]), last)

    def pair(self) -> tuple[RunKey, RunKey]:
        """(baseline run, compared run) of this key's pair: (OFF, ON), or (no tier, tier) for the offload
        case; the baseline never carries a hash algorithm."""
        on_case = self.case if self.case in PAIRS else {v: k for k, v in PAIRS.items()}[self.case]
        if self.family == "multiturn":
            return RunKey(PAIRS[on_case], self.concurrency), RunKey(on_case, self.concurrency, variant=self.variant)
        return RunKey(PAIRS[on_case], self.concurrency), RunKey(on_case, self.concurrency, self.hash_algo)


@dataclass(frozen=True)
class Prediction:
    """What a cold APC-on server must count for one run, with the tolerance and its reason."""

    expected_hits: int
    tolerance: int  # how far below the prediction hits may fall
    tolerance_above: int  # how far above: under half a request's share where it spans 2+ blocks (a warm cache)
    shared_prefix_tokens: int  # S: the prefix as the server sees it (template header included)
    block_size: int
    shared_blocks: int  # floor(S / B)
    computed_tokens_off: int  # prefill the OFF server computes
    computed_tokens_on: int  # prefill the ON server must still compute (predicted)
    prefill_bound: float  # computed_off / computed_on: the most prefill APC can save
    prefix_groups: int = 1  # G
    header_block_tokens: int = 0  # Q = floor(header / B) * B: what requests of different groups share

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)

    @property
    def group_tokens(self) -> int:
        """P = floor(S / B) * B: what a request hits on a replica that already served its prefix group."""
        return self.shared_blocks * self.block_size

    def replica_hits(self, requests: int, cold: int) -> int:
        """Hits of one cold replica that served ``requests`` requests, ``cold`` of them the first of their
        prefix group there: (k - c) * P + (c - 1) * Q (its very first request hits nothing)."""
        if requests == 0:
            return 0
        return (requests - cold) * self.group_tokens + (cold - 1) * self.header_block_tokens

    def cold_prefills(self, requests: int, hits: int) -> tuple[int | None, int]:
        """The number of cold prefills that explains one replica's hits, and the hits left unexplained.

        Inverts ``replica_hits``: c = (k * P - Q - hits) / (P - Q), rounded, within 1..min(k, G). None when
        the prefix does not span a block beyond the header (P == Q): then every request hits the same.
        """
        if requests == 0:
            return 0, hits
        per_group = self.group_tokens - self.header_block_tokens
        if per_group <= 0:
            return None, hits
        cold = round((requests * self.group_tokens - self.header_block_tokens - hits) / per_group)
        cold = min(max(cold, 1), min(requests, self.prefix_groups))
        return cold, hits - self.replica_hits(requests, cold)


def predict(workload: Workload, header_tokens: int, block_size: int, total_input_tokens: int) -> Prediction:
    """Expected hits on one cold server: (N - G) * floor(S/B) * B + (G - 1) * floor(H/B) * B, with
    S = header + prefix, H = header and G prefix groups; for one group, (N-1) * floor(S/B) * B.

    Each group's first request computes its prefix, every other one hits it; a first request of a
    group still hits the header blocks another group left. vLLM registers a request's blocks when it is
    scheduled, so the number does not depend on concurrency. A case without a shared prefix can still
    hit the template header when it spans a block. Tolerance below: one block per request for
    tokenisation at the prefix/suffix boundary. Above: the same, but less than half of one request's
    shared blocks, so that a cache warm from an earlier run (every request hits, the first one too: N
    instead of N-1) cannot pass; where a request shares at most one block, chance matches of the
    suffixes (seen on the H200: 3 blocks of 16) look the same.
    """
    n, groups = workload.num_prompts, workload.prefix_groups
    shared = header_tokens + workload.prefix_len
    blocks = workload.shared_blocks(header_tokens, block_size)
    header_blocks = (header_tokens // block_size) * block_size
    expected = (n - groups) * blocks * block_size + (groups - 1) * header_blocks
    tolerance = (n - 1) * block_size
    tolerance_above = tolerance if blocks <= 1 else min(tolerance, blocks * block_size // 2)
    computed_off = total_input_tokens
    computed_on = max(1, total_input_tokens - expected)
    return Prediction(
        expected_hits=expected,
        tolerance=tolerance,
        tolerance_above=tolerance_above,
        shared_prefix_tokens=shared,
        block_size=block_size,
        shared_blocks=blocks,
        computed_tokens_off=computed_off,
        computed_tokens_on=computed_on,
        prefill_bound=computed_off / computed_on,
        prefix_groups=groups,
        header_block_tokens=header_blocks,
    )
